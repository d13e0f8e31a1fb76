"""Safe against web pages: a request must name this server, and a browser's request must come from one of
its own pages or from an origin the household allowed.

Any page a household member opens can send requests to a server on their machine, so two checks run
before any route (``OriginGuard``, an app-wide middleware), whatever the keys:

- **Host** (DNS rebinding: a page on attacker.example re-resolves its own name to 127.0.0.1, and the
  browser then treats the server as part of the page's origin; its requests say ``Host:
  attacker.example``). Served: ``localhost`` (and ``*.localhost``), loopback addresses, the bound host,
  the machine's hostname (and ``HOSTNAME.local``), any address of the machine's interfaces when bound to
  0.0.0.0 / ::, and the names in HOMEAI_ALLOWED_HOSTS (comma separated, ``*`` for any). Others: 403.
- **Origin** (a cross-site page: a form post or a ``fetch`` with a text/plain body is a "simple" request,
  which the browser sends without asking; CORS only hides the answer, the request still runs). A request
  with an ``Origin`` header is served only from the same origin (the origin names the host the request
  was sent to), from the server's own origins (``http(s)://localhost:PORT``, ``http://127.0.0.1:PORT``,
  ``http://[::1]:PORT``, any allowed host at the server's port), or from HOMEAI_ORIGINS (comma separated,
  ``*`` in any part, ``*`` alone for any, as Ollama's OLLAMA_ORIGINS). Others: 403. Requests without
  ``Origin`` (curl, SDKs, Home Assistant) pass, unless a browser marks a state-changing one
  ``Sec-Fetch-Site: cross-site`` or ``same-site``.

CORS preflights (OPTIONS with ``Origin``) are answered by Litestar's CORS middleware with the same origin
rule (``OwnOriginsCORS``): 204 with ``Access-Control-Allow-Origin`` for an allowed origin, 400 otherwise.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from litestar.config.cors import CORSConfig
from litestar.datastructures import Headers
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware

from homeai.api.errors import ApiError

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Receive, Scope, Send

    from homeai.api.settings import Settings

log = logging.getLogger(__name__)

ANY = "*"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ADDRESS_REFRESH_S = 30.0  # interfaces change (DHCP, VPN): an unknown address re-reads them this often at most
_DEFAULT_PORTS = {"http": 80, "https": 443}
_WILDCARD_BINDS = {"", "0.0.0.0", "::", "[::]"}


class Forbidden(ApiError):
    status_code = 403


def host_name(host: str) -> str:
    """The name or address in a Host header (or an origin's authority), lower case, without port,
    brackets or a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        host = host.partition(":")[0]
    return host.rstrip(".")


def ip_of(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.partition("%")[0])  # fe80::1%eth0: the zone does not matter
    except ValueError:
        return None


def machine_addresses() -> set[str]:
    """Every address of this machine's interfaces (psutil where installed; else Linux's own lists),
    plus what its hostname resolves to."""
    found: set[str] = set()
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            found.update(a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:  # psutil missing (it is no dependency of ours) or failing
        found |= _linux_addresses()
    try:
        found.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return {ip.compressed for ip in map(ip_of, found) if ip is not None}


def _linux_addresses() -> set[str]:
    found: set[str] = set()
    try:  # IPv6: /proc/net/if_inet6 lists every address as 32 hex digits
        with open("/proc/net/if_inet6", encoding="ascii") as f:
            found.update(str(ipaddress.IPv6Address(int(line.split()[0], 16))) for line in f if line.strip())
    except (OSError, ValueError):
        pass
    try:  # IPv4: each interface's address (SIOCGIFADDR)
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                    found.add(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    continue
    except (ImportError, OSError):
        pass
    return found


def origins_pattern(origins: tuple[str, ...]) -> re.Pattern[str] | None:
    """HOMEAI_ORIGINS as one pattern: ``*`` matches anything within an origin (as Litestar's CORSConfig)."""
    parts = [re.escape(o.rstrip("/").lower()).replace(r"\*", ".*") for o in origins if o != ANY]
    return re.compile("|".join(parts)) if parts else None


@dataclass
class WebOrigins:
    """Which Host headers and which browser origins this server answers (see the module's docstring)."""

    bind_host: str = "127.0.0.1"
    port: int = 8000
    allowed_hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    addresses: Callable[[], set[str]] = machine_addresses
    hostname: str = field(default_factory=socket.gethostname)
    _names: set[str] = field(init=False, default_factory=set)
    _pattern: re.Pattern[str] | None = field(init=False, default=None)
    _known: set[str] = field(init=False, default_factory=set)
    _known_at: float = field(init=False, default=-1e9)

    def __post_init__(self) -> None:
        bind = host_name(self.bind_host)
        self.any_host = ANY in self.allowed_hosts
        self.any_origin = ANY in self.origins
        self.wildcard_bind = bind in _WILDCARD_BINDS or self.bind_host in _WILDCARD_BINDS
        short = self.hostname.lower().rstrip(".")
        names = {"localhost", short, short.split(".")[0] + ".local", short.split(".")[0]}
        names |= {host_name(h) for h in self.allowed_hosts if h != ANY}
        if not self.wildcard_bind:
            names.add(bind)
        self._names = {n if ip_of(n) is None else ip_of(n).compressed for n in names if n}  # type: ignore[union-attr]
        self._pattern = origins_pattern(self.origins)

    @classmethod
    def from_settings(cls, settings: Settings) -> WebOrigins:
        return cls(settings.host, settings.port, settings.allowed_hosts, settings.origins)

    # ---- Host ------------------------------------------------------------------------------------
    def is_own_host(self, name: str) -> bool:
        """``name`` (from ``host_name``) is one of this server's names or addresses."""
        if name in self._names or name.endswith(".localhost"):  # *.localhost never leaves the machine
            return True
        ip = ip_of(name)
        if ip is None:
            return False
        if ip.is_loopback or ip.compressed in self._names:
            return True
        return self.wildcard_bind and self._is_machine_address(ip.compressed)

    def host_allowed(self, host_header: str) -> bool:
        """A request without Host (HTTP/1.0) comes from no browser; with one, it must name this server."""
        return self.any_host or not host_header.strip() or self.is_own_host(host_name(host_header))

    def _is_machine_address(self, address: str) -> bool:
        now = time.monotonic()
        if address not in self._known and now - self._known_at > ADDRESS_REFRESH_S:
            self._known_at = now
            try:
                self._known = self.addresses()
            except Exception:
                log.exception("could not list this machine's addresses")
        return address in self._known

    # ---- Origin ----------------------------------------------------------------------------------
    def origin_allowed(self, origin: str, host_header: str = "") -> bool:
        """``origin`` may call: HOMEAI_ORIGINS, the same origin as the request's Host, or an own origin."""
        origin = origin.strip().lower().rstrip("/")
        if self.any_origin or (self._pattern is not None and self._pattern.fullmatch(origin)):
            return True
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme not in _DEFAULT_PORTS or not authority or "/" in authority:
            return False  # "null" (sandboxed frames, file pages), extensions, anything malformed
        name, port = host_name(authority), _port_of(authority, _DEFAULT_PORTS[scheme])
        if port is None:
            return False
        if host_header.strip():  # same origin: the page was served by the host this request names
            # A Host without a port names the default port of the page's scheme (it stood for "any port":
            # with the server behind a proxy on port 80, a page on localhost:3000 passed for same-origin).
            host = host_header.strip().lower()
            if name == host_name(host) and port == _port_of(host, _DEFAULT_PORTS[scheme]) \
                    and self.host_allowed(host_header):
                return True
        return port == self.port and self.is_own_host(name)


def _port_of(authority: str, default: int) -> int | None:
    """The port in ``host[:port]`` (``default`` when none is written); None if it is not a number."""
    rest = authority.rpartition("]")[2] if authority.startswith("[") else authority
    if ":" not in rest:
        return default
    text = rest.rpartition(":")[2]
    return int(text) if text.isdigit() else None


class OriginGuard(ASGIMiddleware):
    """App-wide: refuse (403) a request whose Host is not this server, or which a browser sent from a page
    whose origin may not call it. Runs before guards, so before keys and bodies are looked at."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, web: WebOrigins) -> None:
        self.web = web

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        headers = Headers.from_scope(scope)
        host = headers.get("host", "")
        if not self.web.host_allowed(host):
            raise Forbidden(f"this server does not answer to the name {host_name(host)!r} (a web page's DNS "
                            "rebinding?); add it to HOMEAI_ALLOWED_HOSTS if it is really this server's",
                            code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None:
            if not self.web.origin_allowed(origin, host):
                raise Forbidden(f"web pages from {origin!r} may not call this server; allow that origin "
                                "with HOMEAI_ORIGINS", code="origin_not_allowed")
        elif scope.get("method") not in SAFE_METHODS and headers.get("sec-fetch-site") in ("cross-site",
                                                                                          "same-site"):
            raise Forbidden("a browser sent this request from another site; only this server's own pages "
                            "and HOMEAI_ORIGINS may call it", code="origin_not_allowed")
        await next_app(scope, receive, send)


@dataclass
class OwnOriginsCORS(CORSConfig):
    """Litestar's CORS (preflights, Access-Control-* headers) with ``WebOrigins``' origin rule."""

    web: WebOrigins | None = None

    def is_origin_allowed(self, origin: str) -> bool:
        return self.web is not None and self.web.origin_allowed(origin)


def web_protection(settings: Settings) -> dict[str, Any]:
    """The Litestar arguments that make the app safe against web pages: the guard and the CORS config."""
    web = WebOrigins.from_settings(settings)
    cors = OwnOriginsCORS(allow_origins=[ANY] if web.any_origin else [], expose_headers=["Retry-After"], web=web)
    return {"middleware": [OriginGuard(web)], "cors_config": cors}
