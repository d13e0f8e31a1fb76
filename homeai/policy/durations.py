"""``keep_alive`` as Ollama takes it: how long an idle model stays loaded.

A Go duration string ("5m", "1h30m", "300ms", "-1m"), or a number of seconds (an int, a float, or one
written as a string: some clients send "300" or "-1"). Negative: stay loaded; 0: unload as soon as the
model is idle. The policy's ``models.<name>.keep_alive`` and the requests' ``keep_alive`` share this.
"""

from __future__ import annotations

import math
import re

KeepAlive = str | int | float

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_GO_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+|\d+(\.\d*)?)")
MAX_KEEP_ALIVE_S = 100 * 365 * 86400.0  # longer is "forever" written otherwise (-1), and overflowed a date


def parse_keep_alive(value: KeepAlive) -> float | None:
    """Seconds an idle model stays loaded (0: unload when idle); None: stay loaded. ValueError when
    ``value`` is neither a Go duration nor a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a duration or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        if not _GO_DURATION.fullmatch(text):
            raise ValueError(f"keep_alive must be a duration such as \"5m\" or \"1h30m\", or a number of seconds "
                             f"(negative: stay loaded); got {value!r}")
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if _PART.match(body):
            seconds = sign * sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(body))
        else:
            seconds = sign * float(body)
    if math.isnan(seconds) or seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(f"keep_alive must be at most {MAX_KEEP_ALIVE_S / 86400 / 365:.0f} years (negative: stay "
                         f"loaded); got {value!r}")
    return None if seconds < 0 else seconds


def describe_keep_alive(seconds: float | None) -> str:
    """``None`` -> "forever", 0 -> "0s (unloaded when idle)", 300 -> "5m"."""
    if seconds is None:
        return "forever"
    if seconds == 0:
        return "0s (unloaded when idle)"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
