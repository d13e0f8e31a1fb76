"""Prometheus series of one recorder, in its own CollectorRegistry (never the global one).

Per-request series (histograms and counters) are updated as requests progress; the engine's state
(running and waiting by class, KV usage, steps, preemptions, last batch) is read from a
``Gateway.snapshot()`` dict at scrape time by ``SnapshotCollector``, so the device loop never pays
for metrics nobody reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from homeai.metrics.prefix import prefix_families

# Seconds. TTFT spans a voice reply (tens of ms) to a queued background prompt (minutes).
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
ITL_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0)


class PromSeries:
    """The labelled series a MetricsRecorder writes; children are cached per label set (hot path)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.ttft = Histogram("homeai_ttft_seconds", "Time to first token", ["class_name"],
                              buckets=TTFT_BUCKETS_S, registry=reg)
        self.itl = Histogram("homeai_itl_seconds", "Inter-token latency", ["class_name"],
                             buckets=ITL_BUCKETS_S, registry=reg)
        self.queue = Histogram("homeai_queue_seconds", "Time from arrival to leaving the class queue",
                               ["class_name"], buckets=TTFT_BUCKETS_S, registry=reg)
        self.e2e = Histogram("homeai_e2e_seconds", "End-to-end request latency", ["class_name"],
                             buckets=E2E_BUCKETS_S, registry=reg)
        self.prompt_tokens = Counter("homeai_prompt_tokens", "Prompt tokens received",
                                     ["user", "class_name"], registry=reg)
        self.generation_tokens = Counter("homeai_generation_tokens", "Tokens generated",
                                         ["user", "class_name"], registry=reg)
        self.started = Counter("homeai_requests_started", "Requests submitted (started minus finished: in flight)",
                               ["class_name"], registry=reg)
        self.requests = Counter("homeai_requests", "Finished requests", ["class_name", "status"], registry=reg)
        self.rejections = Counter("homeai_rejections", "Requests rejected", ["class_name", "reason"],
                                  registry=reg)
        self.collector = SnapshotCollector()
        reg.register(self.collector)
        self._children: dict[tuple[str, ...], Any] = {}

    def remove_user(self, user: str) -> None:
        """Drop the series of a user label that is handed to another user (its counters start over)."""
        for metric in (self.prompt_tokens, self.generation_tokens):
            for key in [k for k in self._children if k[0] == str(id(metric)) and k[1] == user]:
                metric.remove(*key[1:])
                del self._children[key]

    def child(self, metric: Histogram | Counter, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: labels() takes a lock and builds a tuple on each call."""
        key = (str(id(metric)), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


class SnapshotCollector(Collector):
    """Gauges from the Gateway snapshot handed to it just before a scrape (``snapshot`` attribute)."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None

    def describe(self) -> list[Metric]:
        return []  # nothing at registration time: the snapshot arrives with the scrape

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot or {}
        running = GaugeMetricFamily("homeai_running", "Running requests by class", labels=["class_name"])
        waiting = GaugeMetricFamily("homeai_waiting", "Queued requests by class", labels=["class_name"])
        for name, c in sorted((snap.get("classes") or {}).items()):
            running.add_metric([name], float(c.get("running", 0)))
            waiting.add_metric([name], float(c.get("queued", 0)))
        yield running
        yield waiting
        kv = GaugeMetricFamily("homeai_kv_cache_usage_ratio", "KV cache blocks in use", labels=["model"])
        steps = CounterMetricFamily("homeai_engine_steps", "Engine steps run", labels=["model"])
        preempt = CounterMetricFamily("homeai_preemptions", "Sequences preempted", labels=["model"])
        batch_tokens = GaugeMetricFamily("homeai_last_batch_tokens", "Tokens in the last LLM step",
                                         labels=["model"])
        batch_seqs = GaugeMetricFamily("homeai_last_batch_seqs", "Sequences in the last LLM step",
                                       labels=["model"])
        for model, d in sorted((snap.get("device") or {}).items()):
            kv.add_metric([model], float(d.get("kv_usage", 0.0)))
            steps.add_metric([model], float(d.get("steps", 0)))
            preempt.add_metric([model], float(d.get("preemptions", 0)))
            batch_tokens.add_metric([model], float(d.get("last_batch_tokens", 0)))
            batch_seqs.add_metric([model], float(d.get("last_batch_seqs", 0)))
        yield from (kv, steps, preempt, batch_tokens, batch_seqs)
        yield from _residency_families(snap)
        yield from _node_families(snap)
        errors = CounterMetricFamily("homeai_engine_errors", "Failed LLM steps, embedding batches and loop "
                                     "iterations, by source (model, embedding, loop), part and exception type",
                                     labels=["source", "part", "cause"])
        health = snap.get("engine_health") or {}
        for err in health.get("errors") or []:
            errors.add_metric([str(err["source"]), str(err["part"]), str(err["cause"])], float(err["count"]))
        yield errors
        yield GaugeMetricFamily("homeai_engine_failing", "1 while the engine keeps failing (readiness is down)",
                                value=1.0 if health.get("failing") else 0.0)
        yield from prefix_families(snap)


def _node_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """A cluster's nodes (``homeai serve --cluster``), labelled by node and device: up or gone, their load,
    and the requests each served or failed. Nothing without a cluster."""
    nodes = (snap.get("cluster") or {}).get("nodes")
    if nodes is None:
        return
    labels = ["node", "device"]
    up = GaugeMetricFamily("homeai_node_up", "1 while the node's replica serves, 0 loading or left", labels=labels)
    running = GaugeMetricFamily("homeai_node_running", "Running requests on the node by class",
                                labels=[*labels, "class_name"])
    queued = GaugeMetricFamily("homeai_node_queued", "Queued requests on the node by class",
                               labels=[*labels, "class_name"])
    free_kv = GaugeMetricFamily("homeai_node_free_kv_tokens", "Tokens the node's KV cache can still take",
                                labels=labels)
    requests = CounterMetricFamily("homeai_node_requests", "LLM requests the front door placed there, by outcome",
                                   labels=[*labels, "outcome"])
    # One series per (node, device): a node that restarts is a new Ray node under the same name, and its
    # entry that left stays listed; both gave the same series (Prometheus keeps the first, the left one's 0).
    current: dict[tuple[str, str], dict[str, Any]] = {}
    for n in nodes:
        key = (str(n["name"]), str(n["device"]))
        if key not in current or (current[key]["state"] == "left" and n["state"] != "left"):
            current[key] = n
    for (name, dev), n in current.items():
        node = [name, dev]
        up.add_metric(node, 1.0 if n["state"] == "ready" else 0.0)
        for cls, count in n["running"].items():
            running.add_metric([*node, cls], float(count))
        for cls, count in n["queued"].items():
            queued.add_metric([*node, cls], float(count))
        free_kv.add_metric(node, float(n["free_kv_tokens"]))
        requests.add_metric([*node, "served"], float(n["served"]))
        requests.add_metric([*node, "failed"], float(n["failed"]))
    yield from (up, running, queued, free_kv, requests)


def _residency_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """Every LLM the policy names, loaded or not: whether it is on the device, what it holds there, how long
    its last load took and how often it loaded; and the memory budget the loaded models share."""
    loaded = GaugeMetricFamily("homeai_model_loaded", "1 while the LLM is on the device", labels=["model"])
    resident = GaugeMetricFamily("homeai_model_resident_bytes", "Weights and KV cache the LLM holds",
                                 labels=["model"])
    load_s = GaugeMetricFamily("homeai_model_load_seconds", "How long the LLM's last load took", labels=["model"])
    loads = CounterMetricFamily("homeai_model_loads", "Times the LLM was loaded", labels=["model"])
    waiting = GaugeMetricFamily("homeai_model_waiting_for_load", "Requests waiting for the LLM to load",
                                labels=["model"])
    for model, m in sorted((snap.get("models") or {}).items()):
        loaded.add_metric([model], 1.0 if m.get("loaded") else 0.0)
        resident.add_metric([model], float(m.get("resident_bytes", 0)))
        load_s.add_metric([model], float(m.get("load_s") or 0.0))
        loads.add_metric([model], float(m.get("num_loads", 0)))
        waiting.add_metric([model], float(m.get("waiting_for_load", 0)))
    yield from (loaded, resident, load_s, loads, waiting)
    memory = snap.get("memory") or {}
    if memory.get("budget_bytes") is not None:
        yield GaugeMetricFamily("homeai_memory_budget_bytes", "What the loaded models may hold together",
                                value=float(memory["budget_bytes"]))
    if memory.get("held_bytes") is not None:
        yield GaugeMetricFamily("homeai_memory_held_bytes", "What the loaded models (and encoders) hold",
                                value=float(memory["held_bytes"]))
