"""`homeai bench serve`'s figures from made-up request records: per-request timings, percentiles, the
household's loaded ÷ reference ratios, error and lost counts, option parsing and the table."""

from __future__ import annotations

import argparse

import pytest

from homeai.bench.serve_bench import (
    CUT,
    LOST,
    NTH_TOKEN,
    OK,
    PENDING,
    SSE_ERROR,
    STANDARD_LEVELS,
    TEMPLATE_TOKENS,
    BenchOptions,
    HouseholdRun,
    Prompts,
    RequestRecord,
    add_serve_arguments,
    assemble_report,
    chunk_token_ratio,
    compiling,
    error_counts,
    format_table,
    household_figures,
    household_schedule,
    idle_figures,
    options_from_args,
    percentile,
    prompt_tokens_seen,
    single_figures,
    window_tok_s,
)


def record(cls: str = "chat", sent: float = 0.0, chunks: list[float] | None = None, status: str = OK,
           output_tokens: int | None = None, prompt_tokens: int | None = None, prompt_target: int = 32,
           ) -> RequestRecord:
    return RequestRecord(cls, prompt_target, 128, sent_s=sent, chunk_s=list(chunks or []), status=status,
                         output_tokens=output_tokens, prompt_tokens=prompt_tokens)


def evenly(first: float, gap: float, n: int) -> list[float]:
    return [first + i * gap for i in range(n)]


def test_one_request_gives_ttft_itl_nth_token_and_decode_speed() -> None:
    rec = record(sent=1.0, chunks=evenly(1.2, 0.05, 21), output_tokens=21)
    assert rec.ttft_ms == pytest.approx(200.0)
    assert rec.itl_ms == pytest.approx([50.0] * 20)
    assert rec.token_ms(12) == pytest.approx(200.0 + 11 * 50.0)
    assert rec.token_ms(22) is None
    assert rec.decode_tok_s == pytest.approx(20 / 1.0)  # (21 - 1) tokens over one second


def test_without_usage_one_chunk_counts_as_one_token() -> None:
    rec = record(chunks=evenly(0.1, 0.1, 5))
    assert rec.tokens == 5 and rec.decode_tok_s == pytest.approx(4 / 0.4)
    assert record(chunks=[0.5]).decode_tok_s is None and record().ttft_ms is None


def test_percentiles_come_from_numpy_and_none_when_empty() -> None:
    assert percentile(list(range(1, 101)), 50) == pytest.approx(50.5)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([], 99) is None


def test_single_and_idle_figures_use_finished_requests_only() -> None:
    fast = [record(chunks=evenly(0.1, 0.01, 11), output_tokens=11) for _ in range(3)]  # 100 tok/s
    failed = record(chunks=evenly(0.1, 1.0, 11), status="500")
    assert single_figures([*fast, failed])["single_decode_tok_s"] == pytest.approx(100.0)
    idle = idle_figures([record(chunks=[t]) for t in (0.04, 0.05, 0.06)] + [record(chunks=[9.0], status=CUT)])
    assert idle["idle_ttft_p50_ms"] == pytest.approx(50.0)


def test_errors_by_status_and_lost_are_kept_apart() -> None:
    records = [record(), record(status="429"), record(status="429"), record(status=SSE_ERROR), record(status=CUT),
               record(status=LOST), record(status=PENDING)]
    assert error_counts(records) == {"429": 2, SSE_ERROR: 1, "total": 3}
    assert error_counts([record()]) == {"total": 0}


def test_window_throughput_counts_tokens_inside_the_window() -> None:
    inside = record(chunks=evenly(0.5, 0.5, 4))  # 0.5 .. 2.0
    straddling = record(chunks=evenly(9.0, 0.5, 5), status=CUT)  # 9.0 .. 11.0: 3 inside a window ending at 10
    assert window_tok_s([inside, straddling], start_s=0.0, window_s=10.0) == pytest.approx(0.7)


def voice(sent: float, ttft: float, gap: float = 0.02, n: int = 32) -> RequestRecord:
    return record("voice", sent, evenly(sent + ttft, gap, n), output_tokens=n)


def test_household_ratios_divide_loaded_by_reference() -> None:
    reference = HouseholdRun([voice(t, 0.1) for t in range(10)] + [record("chat", 1, evenly(1.5, 0.05, 10))],
                             start_s=0.0, window_s=20.0)
    summaries = [record("summarize", 0.0, evenly(1.0, 0.1, 100), output_tokens=100),  # 100 tokens, 1.0 .. 10.9
                 record("summarize", 11.0, evenly(15.0, 0.1, 100), status=CUT)]  # 51 tokens up to 20.0
    loaded = HouseholdRun([voice(t, 0.3, gap=0.04) for t in range(10)] + summaries
                          + [record("voice", 19.0, [], status=CUT), record("chat", 5, [], status=LOST)],
                          start_s=0.0, window_s=20.0)
    out = household_figures(loaded, reference)
    assert out["voice_ttft_p99_ms"] == pytest.approx(300.0)
    assert out["voice_ttft_p99_ratio"] == pytest.approx(3.0)
    nth = f"voice_{NTH_TOKEN}th_token_p99_ms"
    assert out[nth] == pytest.approx(300.0 + 11 * 40.0)
    assert out[f"voice_{NTH_TOKEN}th_token_p99_ratio"] == pytest.approx((300 + 440) / (100 + 220), abs=1e-3)
    assert out["voice_itl_p99_ms"] == pytest.approx(40.0)
    assert out["reference"]["voice_itl_p99_ms"] == pytest.approx(20.0)
    assert out["background_tok_s"] == pytest.approx(151 / 20.0)
    assert out["summaries_finished"] == 1 and out["cut_at_window"] == 2 and out["lost"] == 1
    assert out["reference"]["lost"] == 0 and out["reference"]["chat_ttft_p99_ms"] == pytest.approx(500.0)
    assert out["chat_ttft_p99_ms"] is None  # the loaded window's only chat request was lost


def test_a_request_cut_after_its_first_token_still_counts_in_ttft() -> None:
    late = record("voice", 18.0, [18.9], status=CUT)  # 900 ms, then the window ended
    run = HouseholdRun([voice(t, 0.3) for t in range(10)] + [late], start_s=0.0, window_s=20.0)
    out = household_figures(run, run)
    assert out["voice_ttft_p99_ms"] == pytest.approx(300.0 + 0.9 * 600.0)  # numpy's linear p99 of 11 values
    assert out["voice_finished"] == 10 and out["cut_at_window"] == 1


def test_household_schedule_is_voice_every_2_s_and_chat_every_5_s() -> None:
    schedule = household_schedule(10.0)
    assert [t for t, cls, *_ in schedule if cls == "voice"] == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert [t for t, cls, *_ in schedule if cls == "chat"] == [1.0, 6.0]
    assert [t for t, *_ in schedule] == sorted(t for t, *_ in schedule)


def test_prompts_are_sized_in_words_and_start_differently() -> None:
    prompts = Prompts(seed=1)
    first, second = prompts.messages(46), prompts.messages(46)
    assert first[0]["content"] != second[0]["content"] and first[1] == second[1]
    assert len(first[1]["content"].split()) == 2 + 46 - TEMPLATE_TOKENS  # "Write about:" and one word a token
    assert prompts.messages(1)[1]["content"] == "Write about:"


def test_prompt_and_chunk_accounting() -> None:
    records = [record(prompt_tokens=47, prompt_target=46, chunks=[1, 2], output_tokens=2),
               record(prompt_tokens=46, prompt_target=46, chunks=[1, 2, 3], output_tokens=4), record()]
    assert prompt_tokens_seen(records) == {"46": 46}
    assert chunk_token_ratio(records) == pytest.approx(5 / 6, abs=1e-3)
    assert chunk_token_ratio([record()]) is None


def test_compilation_is_pending_until_every_bucket_is_ready_or_it_failed() -> None:
    assert compiling({"m": {"buckets": [1, 2], "ready": [1], "failed": None}}) == ["m"]
    assert compiling({"m": {"buckets": [1, 2], "ready": [2, 1], "failed": None}}) == []
    assert compiling({"m": {"buckets": [1, 2], "ready": [], "failed": "boom"}}) == []


def parse(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return options_from_args(parser.parse_args(list(argv)))


def test_options_quick_then_explicit_values_in_the_documented_phase_order() -> None:
    opts = parse("--quick", "--household-s", "4", "--phases", "household,single", "--streams", "2,1")
    assert opts.phases == ("single", "household") and opts.household_s == 4.0
    assert opts.single_requests == BenchOptions.quick().single_requests and opts.stream_levels == (1, 2)
    assert parse().stream_levels == STANDARD_LEVELS and parse().household_s == 60.0
    for bad in (("--phases", "single,warp"), ("--streams", "0"), ("--streams", "x")):
        with pytest.raises(ValueError):
            parse(*bad)


def test_report_keeps_every_headline_key_and_prints_a_table() -> None:
    reference = HouseholdRun([voice(0, 0.1)], 0.0, 2.0)
    loaded = HouseholdRun([voice(0, 0.2), record("summarize", 0, [0.5, 1.0], status=CUT)], 0.0, 2.0)
    figures = {"single_decode_tok_s": 30.0, "streams_4_tok_s": 80.0, "household": household_figures(loaded, reference)}
    report = assemble_report("http://x", "m", BenchOptions(phases=("single", "streams", "household")), figures,
                             [record(), record(status="503")], {"at_ready": 400.0, "max": 450.0}, None, None,
                             {"start": 1.0, "end": 2.0})
    for key in ("single_decode_tok_s", "idle_ttft_p50_ms", "streams_1_tok_s", "streams_16_tok_s", "errors",
                "rss_mb", "household", "server", "load_avg_1m", "lost"):
        assert key in report, key
    assert report["idle_ttft_p50_ms"] is None and report["errors"] == {"503": 1, "total": 1}
    table = format_table(report)
    assert "single_decode_tok_s" in table and "voice_ttft_p99_ms" in table and "450.0" in table


def test_voice_turns_share_all_but_their_last_words_and_fresh_prompts_share_nothing() -> None:
    from homeai.bench.serve_bench import VOICE_TURN_NEW_WORDS, Prompts

    prompts = Prompts(seed=1)
    first, second = prompts.voice_turn(46, turn=1), prompts.voice_turn(46, turn=2)
    assert first[0] == second[0]  # the same system message: the prefix a cache keeps
    a, b = first[1]["content"].split(), second[1]["content"].split()
    assert len(a) == len(b) and a[:-VOICE_TURN_NEW_WORDS] == b[:-VOICE_TURN_NEW_WORDS]
    assert a[-VOICE_TURN_NEW_WORDS:] != b[-VOICE_TURN_NEW_WORDS:]
    assert prompts.messages(46)[0] != prompts.messages(46)[0]  # each fresh prompt opens with its own number


def test_a_request_that_stalled_before_the_window_ended_counts_as_stalled_and_in_the_figures() -> None:
    """A voice request that got no token for 5 s, and one that stopped after 5 tokens, left every figure
    (they were only "cut"): a hung stream made the loaded window's ratios look better."""
    healthy = [voice(t, 0.1, gap=0.025) for t in range(10)]
    silent = record("voice", 15.0, [], status=CUT)  # nothing for 5 s
    stopped = record("voice", 12.0, evenly(12.1, 0.025, 5), status=CUT)  # 5 tokens, then nothing for ~7.8 s
    just_sent = record("voice", 19.8, [], status=CUT)  # 0.2 s old at the end: not late
    run = HouseholdRun([*healthy, silent, stopped, just_sent], start_s=0.0, window_s=20.0)
    out = household_figures(run, HouseholdRun(healthy, start_s=0.0, window_s=20.0))
    assert out["voice_stalled"] == 2 and out["reference"]["voice_stalled"] == 0
    assert out["voice_ttft_p99_ms"] > 4000  # the silent one's 5 s, a lower bound
    # the stopped one's pending gap joins the pooled gaps (one of ~300 here: p99 stays, p100 would not)
    assert out[f"voice_{NTH_TOKEN}th_token_p99_ms"] > 7000


def test_a_finished_request_with_fewer_tokens_than_forced_counts_as_short() -> None:
    """Every request sets ignore_eos; a server that ignores it (Ollama does) ends answers early, and a
    [DONE] after 1 of 32 tokens passed for a finished request."""
    from homeai.bench.serve_bench import short_count

    records = [record(output_tokens=32), record(output_tokens=1), record(status=CUT, output_tokens=3), record()]
    for r in records:
        r.max_tokens = 32
    assert short_count(records) == 1
