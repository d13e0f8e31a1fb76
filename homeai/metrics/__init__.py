"""Per-request timings and aggregates."""
