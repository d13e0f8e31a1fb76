"""Dashboard: is voice snappy, who is using the GPU, how full is the device — at a glance.

Sections top to bottom: classes (queue, running, TTFT/ITL p50/p99 coloured against the class targets,
prefix-cache hit rate in tokens/requests, rejections), live TTFT charts for the two interactive classes,
people (tokens/s with a sparkline and the fairness counter), the device (KV bar, steps/s, batch), and,
only while the server runs a cluster, its nodes (tui/nodes.py). Fits 80x24; scrolls when there is more.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Static

from tui.documents import ClassStats, DeviceStats, ModelResidency, UserStats
from tui.format import BAD, DIM, bar, fmt_ms, fmt_rate, pair, spark
from tui.history import StatsHistory
from tui.monitor import StatsScreen, monitor_of
from tui.nodes import NodesTable
from tui.widgets import LatencyChart, StatusLine

CLASS_COLUMNS = (("class", "class"), ("queue", "queued"), ("run", "running"), ("TTFT p50/99", "ttft"),
                 ("ITL p50/99", "itl"), ("target", "target"), ("hit %", "hit"), ("ok", "ok"), ("rej", "rej"))
CHART_SPAN_S = 180.0
PEOPLE_SPAN_S = 120.0


def class_order(entry: ClassStats) -> int:
    """Most important first; a class without a priority (no longer in the policy) last."""
    return entry.priority if entry.priority is not None else 99


def chart_classes(classes: dict[str, ClassStats]) -> list[str]:
    """voice and chat when the policy has them, else the two most important interactive LLM classes. A class
    without a priority is no longer in the policy (the server reports it while its figures last): not charted."""
    current = {c: e for c, e in classes.items() if e.priority is not None}
    preferred = [c for c in ("voice", "chat") if c in current]
    rest = sorted((c for c, e in current.items() if c not in preferred and e.kind == "llm" and not e.background),
                  key=lambda c: (class_order(current[c]), c))
    return (preferred + rest)[:2]


def hit_cell(entry: ClassStats) -> Text:
    """Prefix-cache hit rate since start: share of prompt tokens / of requests served from the cache."""
    prefix = entry.prefix_cache
    if not prefix.requests:
        return Text("–", DIM, justify="right")
    tokens, requests = prefix.token_hit_rate, prefix.request_hit_rate
    return Text(f"{100 * tokens:.0f}/{100 * requests:.0f}", style="" if tokens else DIM, justify="right")


def class_cells(entry: ClassStats) -> dict[str, Text | str]:
    """One Classes row: every latency coloured against the class's own target."""
    ttft_t, itl_t = entry.targets.ttft_ms, entry.targets.itl_ms
    rejected = sum(entry.rejections.values())
    target = f"{fmt_ms(ttft_t)}/{fmt_ms(itl_t)}" if ttft_t or itl_t else "–"
    is_llm = entry.kind == "llm"
    return {
        "queued": Text(str(entry.queued), style=BAD if entry.queued > 8 else "", justify="right"),
        "running": Text(str(entry.running), justify="right"),
        "ttft": pair(entry.ttft_p50_ms, entry.ttft_p99_ms, ttft_t),
        "itl": pair(entry.itl_p50_ms, entry.itl_p99_ms, itl_t) if is_llm else Text("–", DIM),
        "target": Text(target, style=DIM),
        "hit": hit_cell(entry) if is_llm else Text("–", DIM, justify="right"),
        "ok": Text(str(entry.requests.get("ok", 0)), justify="right"),
        "rej": Text(str(rejected), style=BAD if rejected else DIM, justify="right"),
    }


class PersonRow(Horizontal):
    """One person: tokens/s over 10 s and 60 s, a sparkline of the 10 s rate (one scale for everyone, so
    the heavy user stands out), and the fairness (VTC) counter in each class."""

    def __init__(self, user: str) -> None:
        super().__init__(classes="person")
        self.user = user

    def compose(self) -> ComposeResult:
        yield Static(Text(self.user), classes="who")  # the server's text is never markup: "[/x]" crashed the app
        yield Static(classes="rates")
        yield Static(classes="spark")
        yield Static(classes="fair")

    def show(self, entry: UserStats, history: StatsHistory) -> None:
        self.query_one(".rates", Static).update(
            f"{fmt_rate(entry.tokens_per_s_10s):>6} {fmt_rate(entry.tokens_per_s_60s):>6}")
        spark_box = self.query_one(".spark", Static)
        columns = max(spark_box.size.width, 1)
        spark_box.update(spark(history.rate_buckets(self.user, columns, PEOPLE_SPAN_S), history.peak_rate()))
        text = " ".join(f"{c}:{v:.0f}" for c, v in sorted(entry.fairness.items()) if v) or "–"
        self.query_one(".fair", Static).update(Text(text, style=DIM, overflow="ellipsis", no_wrap=True))


def residency_line(model: str, r: ModelResidency, width: int = 14) -> Text:
    """An LLM the policy names that is not on the device now: unloaded, loading (and who waits), or why
    its last load failed."""
    name = model if len(model) <= width else model[: width - 1] + "…"
    line = Text.assemble((f"{name:<{width}} ", "bold"), (r.state, DIM if r.state == "unloaded" else ""))
    if r.waiting_for_load:
        line.append(f" · {r.waiting_for_load} waiting", BAD)
    if r.state == "unloaded":
        line.append(" · loads on demand" if r.load == "on_demand" else " · loads when asked", DIM)
    if r.last_error:
        line.append(f" · last load failed: {r.last_error}", BAD)
    return line


def with_residency(line: Text, r: ModelResidency | None) -> Text:
    """A loaded model's line, with what it holds and how long it stays once idle."""
    if r is None:
        return line
    line.append(" · ", DIM).append(f"{r.resident_bytes / 2**20:.0f} MB")
    return line.append(" · pinned" if r.pinned else f" · keep {r.keep_alive}", DIM)


def device_line(model: str, d: DeviceStats, width: int = 14) -> Text:
    """KV usage as a bar, then steps/s, the last batch and preemptions; then what the model runs: its
    weight format and how many decode buckets are compiled (steps of the others run eager)."""
    name = model if len(model) <= width else model[: width - 1] + "…"
    preempt = d.preemptions
    line = Text.assemble((f"{name:<{width}} ", "bold"), "KV ", bar(d.kv_usage, 16),
                         f" {100 * d.kv_usage:3.0f}%", (" · ", DIM),
                         f"{d.steps_per_s:.1f} steps/s", (" · batch ", DIM),
                         f"{d.last_batch_tokens}t/{d.last_batch_seqs}s",
                         (" · ", DIM), (f"{preempt} preempt", BAD if preempt else DIM))
    if d.weights is not None:  # older servers do not say
        line.append(" · ", DIM).append(d.weights if d.weights != "none" else d.dtype or "float")
    compiled = d.compiled_decode
    if compiled is not None:
        if compiled.failed:
            line.append(" · eager (compile failed)", BAD)
        else:
            ready, buckets = len(compiled.ready), len(compiled.buckets)
            line.append(f" · compiled {ready}/{buckets}", DIM if ready < buckets else "")
    elif d.weights is not None:
        line.append(" · eager", DIM)
    return line


class DashboardScreen(StatsScreen):
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
            yield NodesTable(id="nodes", classes="section")
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
        app = monitor_of(self)
        doc, history = app.stats, app.history
        if doc is None or not self.is_mounted:
            return
        self._show_classes(doc.classes)
        self._show_charts(doc.classes, history)
        self._show_people(doc.users, history)
        lines = [with_residency(device_line(m, d), doc.models.get(m)) for m, d in sorted(doc.device.items())]
        lines += [residency_line(m, r) for m, r in sorted(doc.models.items()) if m not in doc.device]
        self.query_one("#device", Static).update(Text("\n").join(lines) if lines else Text("no device", DIM))
        self.query_one("#nodes", NodesTable).show(doc.cluster, doc.time or time.time())

    def _show_classes(self, classes: dict[str, ClassStats]) -> None:
        table = self.query_one("#classes", DataTable)
        order = sorted(classes, key=lambda c: (class_order(classes[c]), c))
        if [str(k.value) for k in table.rows] != order:
            table.clear()
            for name in order:
                cells = class_cells(classes[name])
                table.add_row(Text(name, style="bold"), *(cells[k] for _, k in CLASS_COLUMNS[1:]), key=name)
            return
        for name in order:
            for key, value in class_cells(classes[name]).items():
                table.update_cell(name, key, value)

    def _show_charts(self, classes: dict[str, ClassStats], history: StatsHistory) -> None:
        for i, name in enumerate(chart_classes(classes)):
            chart = self.query_one(f"#chart-{i}", LatencyChart)
            chart.class_name = name
            entry = classes[name]
            values = history.ttft_buckets(name, chart.columns(), chart.span_s)
            chart.set_data(values, entry.targets.ttft_ms, (entry.ttft_p50_ms, entry.ttft_p99_ms))

    def _show_people(self, users: dict[str, UserStats], history: StatsHistory) -> None:
        box = self.query_one("#people", Vertical)
        rows = {row.user: row for row in box.query(PersonRow)}
        for user in rows.keys() - users.keys():  # no longer reported (a server restart): their row goes
            rows.pop(user).remove()
        new = sorted(users.keys() - rows.keys())
        for user in new:
            rows[user] = PersonRow(user)
            box.mount(rows[user])
        if new:  # composed on the next refresh: draw them then, with whatever document is latest
            self.call_after_refresh(self.refresh_stats)
        for user, entry in users.items():
            if rows[user].is_mounted and rows[user].children:
                rows[user].show(entry, history)
