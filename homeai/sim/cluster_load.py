"""What a simulated device publishes to the cluster's router (``ReplicaLoad``), read off its scheduler state
as a real replica's ``load`` poll reads it off its engine."""

from __future__ import annotations

from homeai.cluster.router import ReplicaLoad
from homeai.sim.simulator import Simulator


def class_load(sim: Simulator) -> tuple[dict[str, int], dict[str, int]]:
    """Requests queued and running on the device, by class. An embedding request queues one item per
    input: it counts once, as the request it is."""
    queued: dict[str, int] = {}
    running: dict[str, int] = {}
    for sched in sim.schedulers.values():
        for name, state in sched.classes.items():
            if len(state.queue):
                queued[name] = queued.get(name, 0) + len(state.queue)
            if state.num_running:
                running[name] = running.get(name, 0) + state.num_running
    for name, q in sim.batcher.embed_queues.items():
        if len(q):
            queued[name] = queued.get(name, 0) + len({item.payload[0] for item in q})
    return queued, running


def replica_load(sim: Simulator, replica_id: str, models: tuple[str, ...]) -> ReplicaLoad:
    """The device's load: its queues, its free KV (the fullest model's pool) and its LLM's step cost as
    the planner has fitted it so far (seeded from the cost profile, as a calibrated server is)."""
    queued, running = class_load(sim)
    cost = sim.scheduler.step_cost
    free_kv = min(s.block_manager.num_free_blocks * s.block_manager.block_size for s in sim.schedulers.values())
    return ReplicaLoad(replica_id, node=replica_id, device=sim.cost.name, models=models, base_s=cost.base_s,
                       row_s=cost.per_token_s, prompt_token_s=cost.prompt_token_s or cost.per_token_s,
                       free_kv_tokens=free_kv, block_size=sim.block_manager.block_size,
                       queued=queued, running=running)
