"""Widgets every screen shares: the connection line and the latency chart."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from tui.format import BAD, BLOCKS, DIM, GOOD, WARN, fmt_duration, fmt_ms
from tui.monitor import monitor_of


class StatusLine(Static):
    """Top line of each screen: live or disconnected (in red, with the retry), server, uptime, load, and
    a warning while the server runs a fallback because its policy file was refused at start-up.

    It watches the app's ``connection`` and ``stats`` reactives, so a screen only has to compose it."""

    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; padding: 0 1; }
    StatusLine.-down { background: $error; color: $text; text-style: bold; }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "connection", self._refresh_line)
        self.watch(self.app, "stats", self._refresh_line)

    def _refresh_line(self, _: object = None) -> None:
        app = monitor_of(self)
        conn, url, stats = app.connection, app.url, app.stats
        self.set_class(not conn.connected, "-down")
        if not conn.connected:
            retry = f" · retry in {conn.retry_in_s:g} s" if conn.retry_in_s else ""
            self.update(Text(f"✖ disconnected: {conn.detail or 'connecting'}{retry} · {url}"))
            return
        live = stats.num_live_requests if stats else 0
        line = Text.assemble(("● live ", GOOD), (url, "bold"), (" · up ", DIM),
                             fmt_duration(stats.uptime_s if stats else None), (" · ", DIM), f"{live} in flight")
        policy = stats.policy if stats else None
        if policy is not None and policy.status == "fallback":  # the policy file was refused at start-up
            line.append_text(Text.assemble((" · ", DIM), (f"⚠ policy file refused, running {policy.running}",
                                                          WARN)))
        self.update(line)


class LatencyChart(Widget):
    """A bar chart of one class's TTFT over the last minutes: one column per time slice, green under
    the class target and red over it, the target drawn as a dotted line so a miss is seen, not read."""

    DEFAULT_CSS = "LatencyChart { height: 5; }"

    def __init__(self, class_name: str, *, span_s: float = 180.0, id: str | None = None) -> None:
        super().__init__(id=id)
        self.class_name = class_name
        self.span_s = span_s
        self.values: list[float | None] = []
        self.target_ms: float | None = None
        self.last: tuple[float | None, float | None] = (None, None)

    def columns(self) -> int:
        """How many time slices fit (the history is bucketed to this)."""
        return max(self.size.width, 10)

    def set_data(self, values: list[float | None], target_ms: float | None,
                 last: tuple[float | None, float | None]) -> None:
        self.values, self.target_ms, self.last = values, target_ms, last
        self.refresh()

    def render(self) -> Text:
        width, rows = self.size.width or 40, max(self.size.height - 1, 1)
        p50, p99 = self.last
        target = self.target_ms
        title = Text.assemble((f"{self.class_name} TTFT ", "bold"), (fmt_ms(p50), _style(p50, target)),
                              ("/", DIM), (fmt_ms(p99), _style(p99, target)),
                              (f" ms (≤{fmt_ms(target)})" if target else " ms", DIM))
        title.truncate(width)
        lines = [title, *chart_rows(self.values[-width:], target, rows)]
        return Text("\n").join(lines)


def chart_rows(values: list[float | None], target: float | None, rows: int) -> list[Text]:
    """Render ``values`` as ``rows`` lines of eighth-blocks, top line first (pure, for tests)."""
    top = max([v for v in values if v is not None] + [(target or 0.0) * 1.25, 1e-9])
    per_row = top / rows
    target_row = min(rows - 1, int(target / per_row)) if target else -1
    out: list[Text] = []
    for r in range(rows - 1, -1, -1):  # r = 0 is the bottom row
        line = Text()
        for v in values:
            if v is None:
                line.append("┈" if r == target_row else " ", WARN if r == target_row else DIM)
                continue
            eighths = round((v - r * per_row) / per_row * 8)
            cell = BLOCKS[min(max(eighths, 0), 8)]
            if r == 0 and cell == " ":
                cell = BLOCKS[1]  # a measured value is never invisible
            style = BAD if target is not None and v > target else GOOD
            if cell == " " and r == target_row:
                line.append("┈", WARN)
            else:
                line.append(cell, style)
        out.append(line)
    return out


def _style(value: float | None, target: float | None) -> str:
    if value is None:
        return DIM
    return BAD if target is not None and value > target else GOOD
