"""Dashboard: is voice snappy, who is using the GPU, how full is the device — at a glance.

Sections top to bottom: classes (queue, running, TTFT/ITL p50/p99 coloured against the class targets,
prefix-cache hit rate in tokens/requests, rejections), live TTFT charts for the two interactive classes,
people (tokens/s with a sparkline and the fairness counter), the device (KV bar, steps/s, batch). Fits
80x24; scrolls when there is more.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui.format import BAD, DIM, bar, fmt_ms, fmt_rate, pair, spark
from tui.history import StatsHistory
from tui.widgets import LatencyChart, StatusLine

CLASS_COLUMNS = (("class", "class"), ("queue", "queued"), ("run", "running"), ("TTFT p50/99", "ttft"),
                 ("ITL p50/99", "itl"), ("target", "target"), ("hit %", "hit"), ("ok", "ok"), ("rej", "rej"))
CHART_SPAN_S = 180.0
PEOPLE_SPAN_S = 120.0


def chart_classes(classes: dict[str, dict[str, Any]]) -> list[str]:
    """voice and chat when the policy has them, else the two most important interactive LLM classes."""
    preferred = [c for c in ("voice", "chat") if c in classes]
    rest = sorted((c for c, e in classes.items() if c not in preferred and e.get("kind", "llm") == "llm"
                   and not e.get("background")), key=lambda c: (classes[c].get("priority", 99), c))
    return (preferred + rest)[:2]


def hit_cell(entry: dict[str, Any]) -> Text:
    """Prefix-cache hit rate since start: share of prompt tokens / of requests served from the cache."""
    prefix = entry.get("prefix_cache") or {}
    if not prefix.get("requests"):
        return Text("–", DIM, justify="right")
    tokens, requests = float(prefix.get("token_hit_rate", 0.0)), float(prefix.get("request_hit_rate", 0.0))
    return Text(f"{100 * tokens:.0f}/{100 * requests:.0f}", style="" if tokens else DIM, justify="right")


def class_cells(entry: dict[str, Any]) -> dict[str, Text | str]:
    """One Classes row: every latency coloured against the class's own target."""
    targets = entry.get("targets") or {}
    ttft_t, itl_t = targets.get("ttft_ms"), targets.get("itl_ms")
    rejected = sum((entry.get("rejections") or {}).values())
    target = f"{fmt_ms(ttft_t)}/{fmt_ms(itl_t)}" if ttft_t or itl_t else "–"
    is_llm = entry.get("kind", "llm") == "llm"
    return {
        "queued": Text(str(entry.get("queued", 0)), style=BAD if entry.get("queued", 0) > 8 else "", justify="right"),
        "running": Text(str(entry.get("running", 0)), justify="right"),
        "ttft": pair(entry.get("ttft_p50_ms"), entry.get("ttft_p99_ms"), ttft_t),
        "itl": pair(entry.get("itl_p50_ms"), entry.get("itl_p99_ms"), itl_t) if is_llm else Text("–", DIM),
        "target": Text(target, style=DIM),
        "hit": hit_cell(entry) if is_llm else Text("–", DIM, justify="right"),
        "ok": Text(str((entry.get("requests") or {}).get("ok", 0)), justify="right"),
        "rej": Text(str(rejected), style=BAD if rejected else DIM, justify="right"),
    }


class PersonRow(Horizontal):
    """One person: tokens/s over 10 s and 60 s, a sparkline of the 10 s rate (one scale for everyone, so
    the heavy user stands out), and the fairness (VTC) counter in each class."""

    def __init__(self, user: str) -> None:
        super().__init__(classes="person")
        self.user = user

    def compose(self) -> ComposeResult:
        yield Static(self.user, classes="who")
        yield Static(classes="rates")
        yield Static(classes="spark")
        yield Static(classes="fair")

    def show(self, entry: dict[str, Any], history: StatsHistory) -> None:
        self.query_one(".rates", Static).update(
            f"{fmt_rate(entry.get('tokens_per_s_10s')):>6} {fmt_rate(entry.get('tokens_per_s_60s')):>6}")
        spark_box = self.query_one(".spark", Static)
        columns = max(spark_box.size.width, 1)
        spark_box.update(spark(history.rate_buckets(self.user, columns, PEOPLE_SPAN_S), history.peak_rate()))
        fairness = entry.get("fairness") or {}
        text = " ".join(f"{c}:{v:.0f}" for c, v in sorted(fairness.items()) if v) or "–"
        self.query_one(".fair", Static).update(Text(text, style=DIM, overflow="ellipsis", no_wrap=True))


def device_line(model: str, d: dict[str, Any], width: int = 14) -> Text:
    """KV usage as a bar, then steps/s, the last batch and preemptions; then what the model runs: its
    weight format and how many decode buckets are compiled (steps of the others run eager)."""
    name = model if len(model) <= width else model[: width - 1] + "…"
    preempt = int(d.get("preemptions", 0))
    line = Text.assemble((f"{name:<{width}} ", "bold"), "KV ", bar(d.get("kv_usage"), 16),
                         f" {100 * float(d.get('kv_usage') or 0):3.0f}%", (" · ", DIM),
                         f"{float(d.get('steps_per_s') or 0):.1f} steps/s", (" · batch ", DIM),
                         f"{d.get('last_batch_tokens', 0)}t/{d.get('last_batch_seqs', 0)}s",
                         (" · ", DIM), (f"{preempt} preempt", BAD if preempt else DIM))
    if "weights" in d:
        line.append(" · ", DIM).append(str(d["weights"]) if d["weights"] != "none" else str(d.get("dtype", "float")))
    compiled = d.get("compiled_decode")
    if isinstance(compiled, dict):
        ready, buckets = len(compiled.get("ready") or []), len(compiled.get("buckets") or [])
        if compiled.get("failed"):
            line.append(" · eager (compile failed)", BAD)
        else:
            line.append(f" · compiled {ready}/{buckets}", DIM if ready < buckets else "")
    elif "weights" in d:
        line.append(" · eager", DIM)
    return line


class DashboardScreen(Screen[None]):
    """Redrawn on every streamed stats document; reads the app's ``stats`` and ``history``."""

    DEFAULT_CSS = """
    DashboardScreen #dash { height: 1fr; }
    DashboardScreen .section { border-top: solid $primary-darken-2; border-title-color: $text-accent;
                               height: auto; }
    DashboardScreen #classes { height: auto; }
    DashboardScreen #charts LatencyChart { width: 1fr; height: 5; margin-right: 1; }
    DashboardScreen .person { height: 1; }
    DashboardScreen .who { width: 10; }
    DashboardScreen .rates { width: 14; }
    DashboardScreen .spark { width: 1fr; height: 1; margin-right: 1; }
    DashboardScreen .fair { width: 24; }
    DashboardScreen #people-head { color: $text-muted; height: 1; }
    """

    def compose(self) -> ComposeResult:
        yield StatusLine()
        with VerticalScroll(id="dash"):
            table: DataTable[Any] = DataTable(id="classes", classes="section", cursor_type="none",
                                              zebra_stripes=True)
            table.border_title = "Classes · last 60 s · ms"
            yield table
            with Horizontal(id="charts", classes="section") as charts:
                charts.border_title = f"TTFT p99 · last {CHART_SPAN_S / 60:.0f} min"
                yield LatencyChart("voice", span_s=CHART_SPAN_S, id="chart-0")
                yield LatencyChart("chat", span_s=CHART_SPAN_S, id="chart-1")
            with Vertical(id="people", classes="section") as people:
                people.border_title = "People · generated tokens/s"
                head = f"{'person':<10}{'10 s':>6} {'60 s':>6}  last {PEOPLE_SPAN_S / 60:.0f} min, one scale for all"
                yield Static(Text(head), id="people-head")
            device = Static(id="device", classes="section")
            device.border_title = "Device"
            yield device
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#classes", DataTable)
        for label, key in CLASS_COLUMNS:
            table.add_column(label, key=key)
        self.refresh_stats()

    def on_screen_resume(self) -> None:
        self.refresh_stats()

    def refresh_stats(self) -> None:
        """Draw the app's latest document (called by the app for each one, and when shown)."""
        doc: dict[str, Any] | None = getattr(self.app, "stats", None)
        history: StatsHistory | None = getattr(self.app, "history", None)
        if not doc or history is None or not self.is_mounted:
            return
        classes = doc.get("classes") or {}
        self._show_classes(classes)
        self._show_charts(classes, history)
        self._show_people(doc.get("users") or {}, history)
        lines = [device_line(m, d) for m, d in sorted((doc.get("device") or {}).items())]
        self.query_one("#device", Static).update(Text("\n").join(lines) if lines else Text("no device", DIM))

    def _show_classes(self, classes: dict[str, dict[str, Any]]) -> None:
        table = self.query_one("#classes", DataTable)
        order = sorted(classes, key=lambda c: (classes[c].get("priority", 99), c))
        if [str(k.value) for k in table.rows] != order:
            table.clear()
            for name in order:
                cells = class_cells(classes[name])
                table.add_row(Text(name, style="bold"), *(cells[k] for _, k in CLASS_COLUMNS[1:]), key=name)
            return
        for name in order:
            for key, value in class_cells(classes[name]).items():
                table.update_cell(name, key, value)

    def _show_charts(self, classes: dict[str, dict[str, Any]], history: StatsHistory) -> None:
        for i, name in enumerate(chart_classes(classes)):
            chart = self.query_one(f"#chart-{i}", LatencyChart)
            chart.class_name = name
            entry = classes[name]
            target = (entry.get("targets") or {}).get("ttft_ms")
            values = history.ttft_buckets(name, chart.columns(), chart.span_s)
            chart.set_data(values, target, (entry.get("ttft_p50_ms"), entry.get("ttft_p99_ms")))

    def _show_people(self, users: dict[str, dict[str, Any]], history: StatsHistory) -> None:
        box = self.query_one("#people", Vertical)
        rows = {row.user: row for row in box.query(PersonRow)}
        new = sorted(users.keys() - rows.keys())
        for user in new:
            rows[user] = PersonRow(user)
            box.mount(rows[user])
        if new:  # composed on the next refresh: draw them then, with whatever document is latest
            self.call_after_refresh(self.refresh_stats)
        for user, entry in users.items():
            if rows[user].is_mounted and rows[user].children:
                rows[user].show(entry, history)
