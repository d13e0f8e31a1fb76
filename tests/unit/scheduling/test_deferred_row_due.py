"""A chat decode row that voice's latency margin keeps out of voice's steps waits at most half of chat's own
ITL target, then runs beside voice: priority decides between voice and chat, but not by starving chat.

Found in a step trace of `homeai bench serve --phases household` (HOMEAI_STEP_TRACE): on the 2-core CPU a
decode row costs ~4 ms against voice's 1.5 ms margin (0.15 of a ~10 ms step), so while a voice request
decoded (~1 s) no chat row fitted, while the summaries' min_share pass (which may pass the margins) kept
adding their rows: chat's stream stalled 1.2-2.8 s, each time a voice request ran (chat ITL target 150 ms).
"""

from __future__ import annotations

from test_latency_margin import CHAT, VOICE, ClassHarness, harness

# The costs the server fitted on this machine (int4 SmolLM2, compiled decode): ~6 ms a step, ~4 ms a row
FITTED_CPU = {"base_s": 0.006, "per_token_s": 0.004, "prompt_token_s": 0.0025, "per_ctx_s": 2e-6}


def run(h: ClassHarness, seconds: float, voice_every_s: float) -> dict[int, list[float]]:
    """Steps on virtual time, each as long as the cost model predicts; a voice request every
    ``voice_every_s``. Returns the times each sequence's tokens came out."""
    tokens: dict[int, list[float]] = {}
    next_voice = 0.5
    while h.clock.now() < seconds:
        if h.clock.now() >= next_voice:
            h.add("voice", user="kid", prompt_len=40, max_tokens=32)
            next_voice += voice_every_s
        plan = h.sched.schedule()
        chunks = plan.chunks
        h.clock.advance(h.sched.step_cost.predict_s(plan.num_tokens, len(chunks),
                                                    sum(c.start + c.num_tokens for c in chunks)) or 0.005)
        before = {s.seq_id: len(s.output_token_ids) for s in h.sched.seqs.values()}
        h.sched.update(plan, h.runner.execute(plan, h.sched.seqs))
        for c in chunks:
            seq = h.sched.seqs.get(c.seq_id)
            grew = seq is None or len(seq.output_token_ids) > before.get(c.seq_id, 0)
            if c.sample and grew:
                tokens.setdefault(c.seq_id, []).append(h.clock.now())
    return tokens


def test_chat_keeps_its_itl_target_while_voice_decodes_beside_background_shares() -> None:
    h = harness(FITTED_CPU, voice=VOICE, chat=CHAT,
                summarize={"min_share": 0.05, "max_running": 4})
    chat = h.add("chat", user="dad", prompt_len=100, max_tokens=400)
    for _ in range(4):
        h.add("summarize", user="indexer", prompt_len=1500, max_tokens=200)
    tokens = run(h, seconds=6.0, voice_every_s=2.0)
    times = tokens[chat.seq_id]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) > 20
    assert max(gaps) <= CHAT["targets"]["itl_ms"] / 1000, f"chat waited {max(gaps) * 1000:.0f} ms for a token"
    voice_ids = [i for i, c in h.class_of.items() if c == "voice"]
    assert len(voice_ids) == 3 and all(len(tokens.get(i, [])) == 32 or h.sched.seqs.get(i) for i in voice_ids)
