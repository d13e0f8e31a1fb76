"""argparse types for the flags several commands share: a wrong value is argparse's usage error naming the
flag (exit 2), not a traceback from deep inside the command (a port of 99999 from bind, a KV cache of -5 MB
that left the engine one 16-token block, ``--device cuda`` on a CPU-only torch from the catalog)."""

from __future__ import annotations

import argparse
import math
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def port(text: str) -> int:
    value = _int(text, "a port")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {value}")
    return value


def positive_int(text: str) -> int:
    value = _int(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def probability(text: str) -> float:
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def seed(text: str) -> int:
    """A random seed torch can take (a 64-bit integer: a larger one failed on the device thread)."""
    value = _int(text, "an integer seed")
    if not INT64_MIN <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"a seed is a 64-bit integer ({INT64_MIN} to {INT64_MAX}), got {value}")
    return value


def seconds(text: str) -> float:
    """A duration: a finite number of seconds, at least 0 (the check ``seconds_from_env`` makes on the env)."""
    value = _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, at least 0, got {text!r}")
    return value


def cluster_address(text: str) -> str:
    """``HOST[:PORT]`` of a Ray head, checked as the cluster will read it and returned as given."""
    from homeai.cluster.ray_process import split_address  # no Ray import: only the address rules

    try:
        split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive integers ("1,2,4,8"), sorted, each once."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,4, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers such as 1,2,4, got {text!r}")
    return values


def device_name(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, whether or not this machine has it (a unit file or compose file for
    another machine is parsed here too)."""
    _parse_device(text)
    return text


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` that this torch build and machine have."""
    import torch

    parsed = _parse_device(text)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: CUDA is not available (this torch build or this machine "
                                             "has no CUDA device)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA devices")
    return text


def _parse_device(text: str) -> Any:
    import torch

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu, cuda, cuda:1 ...)") from None
    if parsed.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text}: only cpu and cuda devices are served")
    return parsed


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
