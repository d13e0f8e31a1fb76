"""Progress: rate over this run's indexing time, ETA from the remaining chunks."""

from __future__ import annotations

from homeai.jobs.progress import Progress


def test_rate_and_eta_count_from_the_start_of_indexing() -> None:
    now = [100.0]
    progress = Progress(clock=lambda: now[0])
    progress.total_chunks, progress.done_chunks = 100, 20  # 20 were committed by an earlier run
    now[0] = 130.0  # 30 s of planning
    assert progress.eta_s() is None
    progress.begin_indexing()
    now[0] = 140.0
    progress.add(40, num_files=4)
    assert progress.rate() == 4.0 and progress.eta_s() == 10.0
    assert progress.to_dict() == {"done_chunks": 60, "total_chunks": 100, "done_files": 4, "total_files": 0,
                                  "phase": "indexing", "chunks_per_s": 4.0, "eta_s": 10.0}
    progress.add(40)
    assert progress.eta_s() == 0.0
