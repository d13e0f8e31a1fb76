"""One server per data directory: ``homeai serve`` holds an exclusive lock on ``<data dir>/homeai.lock``.

Two servers on one data directory (a second `make run`, a systemd unit beside a manual start) each ran the
job scheduler on the same job table, and each start marked the other's live runs "interrupted" and ran them
again. The lock is ``flock``'s: the kernel drops it when the process ends, however it ends, so a crash
leaves nothing to clean up. It covers the data directory (SQLite, the default); servers on other machines
sharing one PostgreSQL database are not seen by it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "homeai.lock"


class DataDirTakenError(RuntimeError):
    """Another process holds the data directory."""


def hold_data_dir(data_dir: Path) -> int:
    """Lock ``data_dir`` (made 0700 if missing) for this process; returns the lock's file descriptor, which
    must stay open as long as the server runs. DataDirTakenError names the holder's pid."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DataDirTakenError(f"another homeai server (pid {holder}) uses the data dir {data_dir}; stop it "
                                "or give this one --data-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
