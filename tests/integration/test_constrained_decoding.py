"""Constrained decoding on the real SmolLM2-135M (fp32, CPU) through the real runner and FCFS scheduler.

(a) An unconstrained greedy request gives the same tokens alone and in a batch whose other rows follow
JSON-schema grammars, joining at different steps, with prompts prefilled in chunks; the constrained rows
give schema-valid JSON. (b) A preempted constrained sequence (its matcher reset, replayed on recompute)
still gives valid JSON, the same as without preemption. (c) logprobs match log_softmax of the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from engine_helpers import assert_engine_empty
from transformers import PreTrainedTokenizerBase

from homeai.core.sequence import Sequence
from homeai.core.types import Constraint, ConstraintKind, SamplingParams
from homeai.engine.builder import EngineConfig, build_llm_engine, chat_prompt_ids
from homeai.engine.llm_engine import LLMEngine
from homeai.runtime.grammar import GrammarError

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"room": {"type": "string", "maxLength": 12},
                                           "on": {"type": "boolean"}},
          "required": ["room", "on"], "additionalProperties": False}
JSON_SCHEMA = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def engine(pulled_models: dict[str, Path]) -> LLMEngine:
    torch.set_num_threads(2)
    # A 32-token budget splits every prompt here into several prefill chunks.
    # float32 weights: a row's logits are then independent of how many rows share its step (int4's kernel
    # picks its arithmetic by row count), so a neighbour's grammar is the only thing that could change them
    cfg = EngineConfig(device="cpu", dtype="float32", quantization="none", kv_cache_mb=16,
                       max_num_batched_tokens=32)
    return build_llm_engine(pulled_models["smollm2-135m-instruct"], cfg)


def chat(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])


def submit(engine: LLMEngine, prompt: list[int], constraint: Constraint | None = None,
           max_tokens: int = 24, logprobs: int | None = None) -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, constraint=constraint, logprobs=logprobs)
    if constraint is not None:
        assert engine.runner.grammars is not None
        engine.runner.grammars.compile(constraint)  # the API does this on a worker thread
    seq = engine.make_sequence(prompt, params)
    engine.scheduler.add(seq)
    return seq


def run(engine: LLMEngine, joins: dict[int, list[tuple[list[int], Constraint | None]]]) -> list[Sequence]:
    """Step until idle; ``joins[step]`` lists requests that arrive before that step (in-flight)."""
    seqs: list[Sequence] = []
    step = 0
    while step == 0 or engine.scheduler.has_work() or any(k >= step for k in joins):
        for prompt, constraint in joins.get(step, []):
            seqs.append(submit(engine, prompt, constraint))
        engine.step()
        step += 1
    assert_engine_empty(engine)
    return seqs


def test_unconstrained_row_is_unchanged_by_constrained_neighbours(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    plain = chat(tok, "Write one sentence about the kitchen light.")
    alone = run(engine, {0: [(plain, None)]})[0]
    asks = [chat(tok, f"Describe the {room} as JSON with keys room and on.") for room in ("kitchen", "hall", "attic")]
    mixed = run(engine, {0: [(asks[0], JSON_SCHEMA), (plain, None)], 2: [(asks[1], JSON_SCHEMA)],
                         5: [(asks[2], JSON_SCHEMA)]})
    assert mixed[1].output_token_ids == alone.output_token_ids
    for seq in (mixed[0], mixed[2], mixed[3]):
        assert seq.status.finish_reason == "stop", tok.decode(seq.output_token_ids)
        jsonschema.validate(json.loads(tok.decode(seq.output_token_ids, skip_special_tokens=True)), SCHEMA)


def test_preempted_constrained_sequence_replays_its_grammar(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    prompt = chat(tok, "Is the porch light on? Answer as JSON.")
    reference = run(engine, {0: [(prompt, JSON_SCHEMA)]})[0]
    seq = submit(engine, prompt, JSON_SCHEMA)
    for _ in range(len(prompt) // 32 + 4):  # prefill, then a few constrained tokens
        engine.step()
    assert 0 < seq.num_output_tokens < reference.num_output_tokens
    engine.scheduler._preempt(seq)  # type: ignore[attr-defined]  # what FCFS does when KV runs out
    engine.runner.release(seq.seq_id)  # the harshest case: the matcher is gone, not merely reset
    while engine.scheduler.has_work():
        engine.step()
    assert seq.num_preemptions == 1
    assert seq.output_token_ids == reference.output_token_ids
    jsonschema.validate(json.loads(tok.decode(seq.output_token_ids, skip_special_tokens=True)), SCHEMA)
    assert_engine_empty(engine)


def test_logprobs_are_log_softmax_of_the_logits(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    prompt = chat(tok, "Name a colour.")
    seq = submit(engine, prompt, max_tokens=6, logprobs=3)
    deltas = []
    while engine.scheduler.has_work():
        deltas += [d for d in engine.step() if d.logprobs]
    ids = prompt + seq.output_token_ids
    with torch.no_grad():
        reference = reference_logits(engine, ids)[len(prompt) - 1:-1].log_softmax(dim=-1)
    got = [lp for d in deltas for lp in d.logprobs]
    assert [g.token_id for g in got] == seq.output_token_ids
    for row, g in enumerate(got):
        assert abs(g.logprob - reference[row, g.token_id].item()) < 1e-3
        assert [t for t, _ in g.top] == reference[row].topk(3).indices.tolist()
        for t, lp in g.top:
            assert abs(lp - reference[row, t].item()) < 1e-3
    assert_engine_empty(engine)


def reference_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """Logits of every position by transformers' own Llama on the same weights (independent of ours)."""
    from transformers import LlamaForCausalLM

    folder = Path(engine.tokenizer.name_or_path)
    model = LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    return model(torch.tensor([ids])).logits[0].float()


def test_grammars_are_cached_and_bad_schemas_explained(engine: LLMEngine) -> None:
    grammars = engine.runner.grammars
    assert grammars is not None
    assert grammars.compile(JSON_SCHEMA) is grammars.compile(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    with pytest.raises(GrammarError) as err:
        grammars.compile(Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "nope"}'))
    assert "nope" in str(err.value) and ".cc:" not in str(err.value)
