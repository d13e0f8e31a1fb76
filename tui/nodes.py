"""The dashboard's nodes table: which machines serve behind the front door, and how loaded each is.

It exists only while the server runs a cluster (``cluster`` in /v1/stats); a single box never shows it,
so the dashboard looks exactly as before. A node that left stays listed, dimmed, with how long ago, so a
machine that dropped out is seen rather than silently missing.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from tui.documents import ClusterStats, NodeStats
from tui.format import BAD, DIM, GOOD, WARN, fmt_duration

NODE_COLUMNS = (("node", "name"), ("device", "device"), ("models", "models"), ("state", "state"),
                ("run/q", "load"), ("free KV", "kv"), ("ok/err", "outcomes"))
MODELS_WIDTH = 14  # the table fits 80 columns
STATE_STYLES = {"ready": GOOD, "loading": WARN}


def fmt_tokens(count: int) -> str:
    """812 -> '812', 12_345 -> '12.3k', 2_500_000 -> '2.5M'."""
    if count < 1000:
        return str(count)
    if count < 999_950:  # not "1000.0k"
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def node_order(node: NodeStats) -> tuple[int, int, str]:
    """The front door's own device first, nodes that left last, by name in between."""
    return (node.name != "local", node.state == "left", node.name)


def node_key(node: NodeStats) -> str:
    return node.node_id or node.name


def models_text(models: list[str], width: int = MODELS_WIDTH) -> str:
    """The first model, cut to fit, and how many more: 'smollm2-13… +1'."""
    if not models:
        return "–"
    more = f" +{len(models) - 1}" if len(models) > 1 else ""
    first = models[0]
    room = width - len(more)
    return (first if len(first) <= room else first[: room - 1] + "…") + more


def node_cells(node: NodeStats, now_s: float) -> dict[str, Text]:
    """One row; ``now_s`` is the server's clock (the document's ``time``), against which ``since_s`` ages."""
    left = node.state == "left"
    if left:
        ago = fmt_duration(now_s - node.since_s) if node.since_s is not None else "–"
        state = Text(f"left {ago} ago", DIM)
    else:
        state = Text(node.state, STATE_STYLES.get(node.state, ""))
    load = f"{sum(node.running.values())}/{sum(node.queued.values())}"
    outcomes = Text.assemble(str(node.served), ("/", DIM),
                             (str(node.failed), BAD if node.failed and not left else DIM), justify="right")
    style = DIM if left else ""
    return {
        "name": Text(node.name, style=DIM if left else "bold"),
        "device": Text(node.device, style=style),
        "models": Text(models_text(node.models), style=style),
        "state": state,
        "load": Text("–" if left else load, style=style, justify="right"),
        "kv": Text("–" if left else fmt_tokens(node.free_kv_tokens), style=style, justify="right"),
        "outcomes": outcomes if not left else Text(outcomes.plain, DIM, justify="right"),
    }


class NodesTable(DataTable[Any]):
    """A compact table of the cluster's nodes; hidden while the stats carry no ``cluster``."""

    DEFAULT_CSS = "NodesTable { height: auto; }"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="none", zebra_stripes=True)
        self.border_title = "Nodes"
        self.display = False

    def on_mount(self) -> None:
        for label, key in NODE_COLUMNS:
            self.add_column(label, key=key)

    def show(self, cluster: ClusterStats | None, now_s: float) -> None:
        """Draw ``cluster`` (None: hide the table), rebuilding rows only when the set of nodes changed."""
        self.display = cluster is not None
        if cluster is None:
            return
        nodes = sorted(cluster.nodes, key=node_order)
        states = [n.state for n in nodes]
        self.border_title = " · ".join(["Nodes"] + [f"{states.count(s)} {s}" for s in ("ready", "loading", "left")
                                                    if s in states])
        keys = [node_key(n) for n in nodes]
        if [str(k.value) for k in self.rows] != keys:
            self.clear()
            for key, node in zip(keys, nodes, strict=True):
                cells = node_cells(node, now_s)
                self.add_row(*(cells[k] for _, k in NODE_COLUMNS), key=key)
            return
        for key, node in zip(keys, nodes, strict=True):
            for column, value in node_cells(node, now_s).items():
                self.update_cell(key, column, value)
