"""Numbers as people read them: short, coloured against their target, bars instead of ratios."""

from __future__ import annotations

import time

from rich.text import Text

BLOCKS = " ▁▂▃▄▅▆▇█"
GOOD, WARN, BAD, DIM = "green", "yellow", "bold red", "dim"


def fmt_ms(value: float | None) -> str:
    """3.14 -> '3.1', 412.7 -> '413', 12345 -> '12.3s'; None -> '–' (no samples in the window)."""
    if value is None:
        return "–"
    if value < 10:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value:.0f}"
    return f"{value / 1000:.1f}s"


def fmt_rate(value: float | None) -> str:
    """Tokens per second with one decimal below 100."""
    if value is None:
        return "–"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def fmt_duration(seconds: float | None) -> str:
    """75 -> '1m15s', 3720 -> '1h02m'; None -> '–'."""
    if seconds is None or seconds < 0:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_clock(epoch_s: float | None) -> str:
    """Local HH:MM:SS of a wall-clock time."""
    return "–" if epoch_s is None else time.strftime("%H:%M:%S", time.localtime(epoch_s))


def against(value: float | None, target: float | None) -> Text:
    """A latency coloured by its target: green when met, red when missed, plain without a target."""
    if value is None:
        return Text("–", style=DIM)
    if target is None:
        return Text(fmt_ms(value))
    return Text(fmt_ms(value), style=GOOD if value <= target else BAD)


def pair(p50: float | None, p99: float | None, target: float | None) -> Text:
    """'p50/p99', each coloured against the class target."""
    return Text.assemble(against(p50, target), ("/", DIM), against(p99, target))


def bar(fraction: float | None, width: int) -> Text:
    """A usage bar: green below 70 %, yellow below 90 %, red above."""
    frac = min(max(fraction or 0.0, 0.0), 1.0)
    filled = round(frac * width)
    style = GOOD if frac < 0.7 else WARN if frac < 0.9 else BAD
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), DIM))


def spark(values: list[float], top: float) -> Text:
    """A one-line sparkline on a shared scale (``top`` = full height), so people compare at a glance;
    an idle stretch is a flat baseline, any activity at least one step up."""
    if top <= 0:
        return Text("▁" * len(values), style=DIM)
    line = Text()
    for v in values:
        level = 0 if v <= 0 else max(2, round(min(v / top, 1.0) * 8))
        line.append(BLOCKS[max(level, 1)], style=DIM if level == 0 else "cyan")
    return line
