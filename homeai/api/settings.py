"""Server settings: where the data lives and how the server listens.

The data directory holds what a household's server keeps between restarts: the policy file it runs
(copied from the repository's ``policies/default.yaml`` on first start, then edited in place and
hot-reloaded) and the SQLite database. Models stay in the model cache (HOMEAI_CACHE_DIR), which is
shared by every data directory.
"""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

DATA_DIR_ENV = "HOMEAI_DATA_DIR"
DATABASE_URL_ENV = "HOMEAI_DATABASE_URL"
CLUSTER_ENV = "HOMEAI_CLUSTER"
JOB_ROOTS_ENV = "HOMEAI_JOB_ROOTS"
ALLOWED_HOSTS_ENV = "HOMEAI_ALLOWED_HOSTS"
ORIGINS_ENV = "HOMEAI_ORIGINS"
DRAIN_TIMEOUT_ENV = "HOMEAI_DRAIN_TIMEOUT_S"
REQUEST_LOG_DAYS_ENV = "HOMEAI_REQUEST_LOG_DAYS"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = REPO_ROOT / "policies" / "default.yaml"
POLICY_FILE_NAME = "policy.yaml"


def default_data_dir() -> Path:
    """HOMEAI_DATA_DIR, else the platform's per-user data directory (XDG on Linux)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "homeai"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "homeai"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "homeai"


def default_job_roots() -> tuple[Path, ...]:
    """The user's home folder, unless it holds the system's own files (a home of ``/``): then none."""
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no home at all (a service user without one)
        return ()
    return () if Path("/etc").resolve().is_relative_to(home) else (home,)


def job_roots_from_env() -> tuple[Path, ...]:
    """HOMEAI_JOB_ROOTS: the folders (separated by os.pathsep) index jobs may read; ``*``: any folder;
    unset or empty: the user's home folder (``default_job_roots``)."""
    raw = os.environ.get(JOB_ROOTS_ENV, "")
    parts = [p.strip() for p in raw.split(os.pathsep) if p.strip()]
    if "*" in parts:
        return (Path("/"),)
    return tuple(Path(p).expanduser().resolve() for p in parts) if parts else default_job_roots()


class SettingError(ValueError):
    """A setting from the environment that cannot be used (``homeai serve`` prints it as one line)."""


def seconds_from_env(name: str, default: float, unit: str = "seconds") -> float:
    """A duration setting: a finite number of ``unit``, at least 0 (``30s`` or ``inf`` gave a traceback)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingError(f"{name} must be a number of {unit}, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SettingError(f"{name} must be a finite number of {unit}, at least 0, got {text!r}")
    return value


def check_database_url(url: str) -> None:
    """SettingError unless ``url`` names a database SQLAlchemy reaches through an async driver
    (``postgres://...`` gave a 60-line exception group once the server had started)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise SettingError(f"{DATABASE_URL_ENV} is not a database URL SQLAlchemy knows: {exc}") from None
    if not getattr(dialect, "is_async", False):
        raise SettingError(f"{DATABASE_URL_ENV} needs an async driver (postgresql+asyncpg://..., "
                           f"sqlite+aiosqlite:///...), got {url.split('://')[0]!r}")


def list_from_env(name: str) -> tuple[str, ...]:
    """A comma-separated setting (HOMEAI_ALLOWED_HOSTS, HOMEAI_ORIGINS) as its non-empty items."""
    return tuple(item.strip() for item in os.environ.get(name, "").split(",") if item.strip())


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (keys are optional there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(slots=True)
class Settings:
    """Everything ``create_app`` needs; built from the command line and the environment."""

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = field(default_factory=default_data_dir)
    policy_path: Path | None = None  # None: <data_dir>/policy.yaml (copied from the repo on first start)
    kv_cache_mb: int = 256
    max_body_bytes: int = 4 * 2**20  # larger request bodies get 413 (before they are read, if the length is sent)
    policy_poll_s: float = 1.0  # how often the policy file's mtime is checked for a hot reload
    drain_timeout_s: float = field(default_factory=lambda: seconds_from_env(DRAIN_TIMEOUT_ENV, 30.0))
    # on SIGTERM: running requests may go on this long before their streams are ended (homeai/api/drain.py)
    request_log_days: float = field(default_factory=lambda: seconds_from_env(REQUEST_LOG_DAYS_ENV, 90.0, "days"))
    # request-log rows older than this are deleted once a day (0: kept for good; a retention job may keep fewer)
    device: str | None = None
    # decode steps through torch.compile: "auto", "on", "off"; None: the engine's default (HOMEAI_COMPILE_DECODE,
    # else auto: wherever torch.compile works, see homeai/runtime/decode_graph.py)
    compile_decode: str | None = None
    cache_dir: Path | None = None  # None: HOMEAI_CACHE_DIR or ~/.cache/homeai
    # HOST[:PORT]: also run a Ray head bound there, and serve LLM requests on the nodes that join it
    # (homeai/cluster/); None: one device, and Ray is never imported
    cluster: str | None = field(default_factory=lambda: os.environ.get(CLUSTER_ENV) or None)
    # None: SQLite in the data dir; else any SQLAlchemy async URL (postgresql+asyncpg://user:pw@host/db)
    database_url: str | None = field(default_factory=lambda: os.environ.get(DATABASE_URL_ENV) or None)
    # folders an index job may read (HOMEAI_JOB_ROOTS; default the home folder); empty: none, ("/",): any
    job_roots: tuple[Path, ...] = field(default_factory=job_roots_from_env)
    # Host names (besides the server's own) a request may be addressed to; "*": any (homeai/api/origin_guard.py)
    allowed_hosts: tuple[str, ...] = field(default_factory=lambda: list_from_env(ALLOWED_HOSTS_ENV))
    # web page origins (besides the server's own) that may call it from a browser; "*": any
    origins: tuple[str, ...] = field(default_factory=lambda: list_from_env(ORIGINS_ENV))
    # `homeai serve`: a start that fails (a damaged model, a device it cannot use) ends the process with one
    # line and exit status 1, not uvicorn's lifespan traceback (repeated at every systemd restart)
    exit_on_start_failure: bool = False

    @property
    def requires_keys(self) -> bool:
        """API keys are required whenever the server is reachable from other machines: bound beyond
        loopback, or behind a name other machines use (``allowed_hosts``: a reverse proxy on this box)."""
        return not is_loopback(self.host) or bool(self.allowed_hosts)

    def resolved_policy_path(self) -> Path:
        return self.policy_path if self.policy_path is not None else self.data_dir / POLICY_FILE_NAME

    def prepare_data_dir(self) -> Path:
        """Create the data directory and, on first start, copy the default policy into it.

        Returns the policy path to load. An explicit ``policy_path`` is used as it is (never copied),
        so a test or an admin can point the server at any file.
        """
        if not self.data_dir.exists():  # the household's documents, request log and key hashes: its owner's
            self.data_dir.mkdir(parents=True, mode=0o700)
        path = self.resolved_policy_path()
        if self.policy_path is None and not path.exists():
            shutil.copyfile(DEFAULT_POLICY, path)
        return path
