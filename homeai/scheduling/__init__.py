"""Class queues, fairness counters, the step planner and the dynamic batcher (no torch here)."""
