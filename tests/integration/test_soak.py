"""A half-minute soak (`homeai bench soak`; a user runs it for hours) against a real server: every class
at once, streams dropped mid-way, 429 storms, policy swaps, indexing and prompt jobs. Afterwards no KV
block is held, every submission the gateway metered has ended, and the request log has exactly one row
per ended request.

Memory and descriptor growth are reported, not judged here: half a minute is too short for a trend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from server_launcher import running_server

from homeai.bench.soak import SoakConfig, run_soak
from homeai.bench.soak_policy import soak_policy_yaml

pytestmark = pytest.mark.slow


def test_a_half_minute_soak_leaks_and_loses_nothing(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                   tmp_path: Path) -> None:
    policy = tmp_path / "soak-policy.yaml"
    policy.write_text(soak_policy_yaml(0), encoding="utf-8")
    with running_server(tmp_path / "data", homeai_cache_dir, policy=policy,
                        env={"HOMEAI_JOB_ROOTS": str(tmp_path)}) as server:
        assert server.proc is not None
        report = run_soak(SoakConfig(server.url, server.proc.pid, server.database_url, tmp_path, minutes=0.5,
                                          swap_every_s=10.0))

    assert report["leaked_kv_blocks"] == 0, report
    assert report["lost_requests"] == 0 and report["live_requests_at_end"] == 0, report
    assert report["request_log_rows"] == report["finished"] > 0, report

    # the half minute did exercise what the soak claims to
    by_class = report["finished_by_class"]
    assert by_class["storm"].get("rejected", 0) > 0, report  # a 429 storm
    assert by_class["chat"].get("aborted", 0) > 0, report  # streams dropped mid-way
    assert by_class["indexing"].get("ok", 0) > 0 and by_class["embedding"].get("ok", 0) > 0, report
    assert sum(by_class["voice"].values()) == by_class["voice"].get("ok", 0) > 0, report
    assert report["jobs"].get("policy_swaps", 0) >= 1, report
    client_outcomes = {outcome for outcomes in report["client"].values() for outcome in outcomes}
    assert not {o for o in client_outcomes if o == "500" or o.startswith("transport")}, report
