from __future__ import annotations

import math

import pytest
import torch

from homeai.core.types import SamplingParams
from homeai.runtime.sampler import (
    GreedyPick,
    Sampler,
    apply_filters,
    apply_penalties,
    greedy_pick,
    make_generator,
)

VOCAB = 50


def random_logits(num_rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def run(logits: torch.Tensor, params: list[SamplingParams], generators=None, outputs=None, prompts=None):
    n = len(params)
    return Sampler().sample(
        logits,
        params,
        prompts or [[] for _ in range(n)],
        outputs or [[] for _ in range(n)],
        generators or [None] * n,
    )


def test_greedy_is_argmax_with_raw_logprob() -> None:
    logits = random_logits(6)
    before = logits.clone()
    tokens, logprobs = run(logits, [SamplingParams(temperature=0.0)] * 6)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs, expected)
    assert torch.equal(logits, before)  # the caller's logits are never modified


def test_greedy_pick_equals_the_samplers_own_answer() -> None:
    logits = random_logits(6, seed=7)
    pick = greedy_pick(logits)
    tokens, logprobs = run(logits, [SamplingParams(temperature=0.0)] * 6)
    assert torch.equal(pick.tokens, tokens)
    assert torch.allclose(pick.logprobs, logprobs, atol=1e-6)


def test_a_given_greedy_pick_serves_only_plain_greedy_steps() -> None:
    """The pick (made with the raw logits, e.g. inside the compiled step) answers a step whose rows are
    all plain greedy; a mask, a penalty, a sampling row or asked-for alternatives change the distribution,
    and then the sampler works from the logits. A sentinel pick shows which way each step went."""
    logits = random_logits(3, seed=8)
    sentinel = GreedyPick(torch.tensor([5, 6, 7]), torch.tensor([-1.0, -2.0, -3.0]))
    plain = [SamplingParams(temperature=0.0)] * 3
    tokens, logprobs = Sampler().sample(logits, plain, [[]] * 3, [[]] * 3, [None] * 3, greedy=sentinel)
    assert tokens.tolist() == [5, 6, 7] and logprobs.tolist() == [-1.0, -2.0, -3.0]
    expected = logits.argmax(-1)
    for params, mask in [
        ([SamplingParams(temperature=0.0, repetition_penalty=1.3)] * 3, None),
        ([SamplingParams(temperature=0.0, logprobs=2)] * 3, None),
        (plain[:2] + [SamplingParams(temperature=1.0, top_k=1)], None),
        (plain, (bitmask_allowing([list(range(VOCAB))]), [0])),
    ]:
        tokens, _ = Sampler().sample(logits, params, [[]] * 3, [[1]] * 3, [None] * 3, mask, greedy=sentinel)
        assert tokens.tolist() != [5, 6, 7]
        if mask is not None or params[0].logprobs:
            assert torch.equal(tokens, expected)


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    logits = random_logits(8, seed=1)
    for params in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)):
        for seed in range(5):
            generators = [make_generator(seed * 100 + i, "cpu") for i in range(8)]
            tokens, logprobs = run(logits, [params] * 8, generators)
            assert torch.equal(tokens, logits.argmax(-1))
            assert torch.allclose(logprobs, torch.zeros(8), atol=1e-6)  # the only token left: p = 1


def test_mixed_batch_greedy_rows_unaffected_by_sampling_rows() -> None:
    logits = random_logits(4, seed=2)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=3),
        SamplingParams(temperature=0.0),
        SamplingParams(min_p=0.2),
    ]
    tokens, logprobs = run(logits, params)
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert torch.allclose(logprobs[[0, 2]], logits[[0, 2]].log_softmax(-1).max(-1).values)
    assert tokens[1] in logits[1].topk(3).indices


def test_top_k_keeps_k_best_and_renormalizes() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]])
    out = apply_filters(logits, [SamplingParams(temperature=1.0, top_k=2)])
    assert torch.isinf(out[0, [0, 3, 4]]).all() and torch.equal(out[0, [1, 2]], logits[0, [1, 2]])
    tokens, logprobs = run(logits, [SamplingParams(top_k=2)])
    expected = logits[0, [1, 2]].log_softmax(-1)[0 if tokens[0] == 1 else 1]
    assert math.isclose(logprobs[0].item(), expected.item(), rel_tol=1e-5)


def test_top_p_keeps_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_filters(probs.log(), [SamplingParams(top_p=0.75)])  # 0.5 + 0.3 reaches 0.75
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()


def test_min_p_drops_tokens_below_fraction_of_max() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_filters(probs.log(), [SamplingParams(min_p=0.2)])  # floor: 0.2 * 0.5 = 0.1
    assert torch.isfinite(out[0, :3]).all() and torch.isinf(out[0, 3])
    out = apply_filters(probs.log(), [SamplingParams(temperature=0.0, min_p=0.9)])
    assert torch.isfinite(out).all()  # greedy rows ignore filters


def test_repetition_penalty_touches_seen_tokens_only() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    params = [SamplingParams(repetition_penalty=2.0)]
    out = apply_penalties(logits, params, prompt_ids=[[0]], output_ids=[[1, 1]])
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 2.0, -2.0, 1.0]]))


def test_repetition_penalty_looks_back_repeat_last_n_tokens() -> None:
    """Ollama's repeat_last_n (64 by default): a token seen only further back than that is not penalised.
    Before: the penalty covered the whole prompt, entity names of a 2k-token system prompt included."""
    logits = torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0]] * 4)
    prompt, output = [0, 1, 2], [3]
    params = [SamplingParams(repetition_penalty=2.0, repeat_last_n=n) for n in (2, 1, 0, -1)]
    out = apply_penalties(logits, params, prompt_ids=[prompt] * 4, output_ids=[output] * 4)
    assert out[0].tolist() == [2.0, 2.0, 1.0, 1.0, 2.0]  # the last two: 2 (prompt) and 3 (output)
    assert out[1].tolist() == [2.0, 2.0, 2.0, 1.0, 2.0]
    assert out[2].tolist() == [2.0] * 5  # 0: off
    assert out[3].tolist() == [1.0, 1.0, 1.0, 1.0, 2.0]  # -1: all of them


def test_ollama_defaults_and_its_random_seed() -> None:
    """Ollama's seed -1 (its default) means random. Before: manual_seed(-1), the same answer every time."""
    from homeai.api.ollama_routes import sampling_params
    from homeai.api.ollama_schemas import Options

    assert sampling_params(Options(seed=-1)).seed is None
    assert sampling_params(Options(seed=7)).seed == 7
    params = sampling_params(None)
    assert (params.repetition_penalty, params.repeat_last_n, params.top_k) == (1.1, 64, 40)


def test_presence_and_frequency_penalties_use_output_counts_only() -> None:
    logits = torch.zeros(2, 5)
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), SamplingParams()]
    out = apply_penalties(logits, params, prompt_ids=[[4], [0]], output_ids=[[1, 1, 1, 2], [1]])
    assert torch.equal(out[0], torch.tensor([0.0, -1.25, -0.75, 0.0, 0.0]))
    assert torch.equal(out[1], torch.zeros(5))  # a neighbour without penalties is untouched


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    tokens, _ = run(logits, [SamplingParams(temperature=0.0, frequency_penalty=0.5)], outputs=[[0]])
    assert tokens.tolist() == [1]
    assert apply_penalties(logits, [SamplingParams()], [[0]], [[0]]) is logits  # nothing asked: no work


def draw_sequence(seed: int, neighbours: int, position: int, steps: int = 20) -> list[int]:
    """Sample ``steps`` tokens for one seeded row that sits among ``neighbours`` other rows."""
    mine = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
    generator = make_generator(seed, "cpu")
    others = [make_generator(1000 + i, "cpu") if i % 2 else None for i in range(neighbours)]
    other_params = [SamplingParams(temperature=[0.0, 1.0, 0.5][i % 3], top_k=5) for i in range(neighbours)]
    tokens = []
    for step in range(steps):
        row = random_logits(1, seed=step)
        batch = random_logits(neighbours + 1, seed=10_000 + step * 7 + neighbours)
        batch[position] = row[0]
        params = other_params[:position] + [mine] + other_params[position:]
        generators = others[:position] + [generator] + others[position:]
        picked, _ = run(batch, params, generators)
        tokens.append(int(picked[position]))
    return tokens


def test_seed_reproducible_whatever_the_neighbours() -> None:
    alone = draw_sequence(seed=7, neighbours=0, position=0)
    assert draw_sequence(seed=7, neighbours=3, position=2) == alone
    assert draw_sequence(seed=7, neighbours=8, position=5) == alone
    assert draw_sequence(seed=8, neighbours=3, position=1) != alone


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=3)]
)
def test_sampling_matches_softmax(params: SamplingParams) -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    expected = logits / params.temperature
    if params.top_k:
        expected[logits.argsort(descending=True)[params.top_k :]] = -math.inf
    expected = expected.softmax(-1)
    rows, rounds = 4000, 10
    torch.manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(rounds):
        tokens, _ = run(logits.expand(rows, 5).contiguous(), [params] * rows)
        counts += torch.bincount(tokens, minlength=5)
    assert torch.allclose(counts / (rows * rounds), expected, atol=0.01)


def test_empty_batch() -> None:
    tokens, logprobs = run(torch.empty(0, VOCAB), [])
    assert tokens.shape == (0,) and logprobs.shape == (0,)


@pytest.mark.gpu
def test_cuda_seeded_rows_reproducible() -> None:
    logits = random_logits(4, seed=3).cuda()
    params = [SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2, seed=5)] * 4
    first = run(logits, params, [make_generator(5, "cuda") for _ in range(4)], prompts=[[1, 2]] * 4)
    again = run(logits[:2], params[:2], [make_generator(5, "cuda") for _ in range(2)], prompts=[[1, 2]] * 2)
    assert first[0].device.type == "cpu"
    assert torch.equal(first[0], torch.full((4,), int(first[0][0])))
    assert torch.equal(again[0], first[0][:2])


def bitmask_allowing(allowed: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """xgrammar's layout: int32 words, bit j % 32 of word j // 32 allows token j."""
    words = torch.zeros(len(allowed), (vocab + 31) // 32, dtype=torch.int64)
    for row, ids in enumerate(allowed):
        for t in ids:
            words[row, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 is the sign bit


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_token_mask_constrains_only_its_rows(device: str) -> None:
    logits = random_logits(3, seed=4).to(device)
    original = logits.clone()
    allowed = [[3, 31, 33], [0, 49]]  # rows 0 and 2 are constrained; 31 and 49 use bit 31 / word 1
    mask = (bitmask_allowing(allowed), [0, 2])
    params = [SamplingParams(temperature=1.0, seed=s, logprobs=2) for s in range(3)]
    gens = [make_generator(s, device) for s in range(3)]
    free_tokens, free_lps = Sampler().sample(logits, params, [[]] * 3, [[]] * 3,
                                             [make_generator(s, device) for s in range(3)])
    for _ in range(20):
        sampler = Sampler()
        tokens, logprobs = sampler.sample(logits, params, [[]] * 3, [[]] * 3, gens, mask)
        assert int(tokens[0]) in allowed[0] and int(tokens[2]) in allowed[1]
        # Logprobs come from the masked distribution: the allowed tokens share all the mass.
        expected = logits[0, allowed[0]].log_softmax(-1).cpu()
        assert math.isclose(float(logprobs[0]), float(expected[allowed[0].index(int(tokens[0]))]), abs_tol=1e-5)
        assert {t for t, _ in sampler.last_top_logprobs[0]} <= set(allowed[0])
    assert torch.equal(logits, original)
    first, first_lp = Sampler().sample(logits, params, [[]] * 3, [[]] * 3,
                                       [make_generator(s, device) for s in range(3)], mask)
    assert int(first[1]) == int(free_tokens[1]) and float(first_lp[1]) == float(free_lps[1])


def test_unpack_bitmask_matches_xgrammar_kernel() -> None:
    """The GPU path's unpacking against xgrammar's CPU kernel, on random words (sign bit included)."""
    import xgrammar as xgr

    from homeai.runtime.sampler import unpack_bitmask

    words = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    logits = torch.zeros(3, 120)
    xgr.apply_token_bitmask_inplace(logits, words, vocab_size=120)
    assert torch.equal(unpack_bitmask(words, 120, torch.device("cpu")), logits == 0)
    assert unpack_bitmask(words, 130, torch.device("cpu"))[:, 128:].sum() == 0  # beyond the words: forbidden


@pytest.mark.parametrize("density", [0.02, 0.5, 0.98])
def test_token_mask_on_cpu_matches_the_dense_reference(density: float) -> None:
    """Both CPU strategies (write the allowed / write the forbidden), every row or some, any density."""
    from homeai.runtime.sampler import apply_token_mask, unpack_bitmask

    g = torch.Generator().manual_seed(int(density * 100))
    allowed = torch.rand(4, 100, generator=g) < density
    allowed[:, 0] = True
    words = bitmask_allowing([row.nonzero().flatten().tolist() for row in allowed], vocab=100)
    assert torch.equal(unpack_bitmask(words, 100, torch.device("cpu")), allowed)
    logits = random_logits(4, seed=2, vocab=100).t().contiguous().t()  # non-contiguous on purpose
    everyone = apply_token_mask(logits, words, [0, 1, 2, 3])
    assert torch.equal(everyone, logits.masked_fill(~allowed, -math.inf))
    some = apply_token_mask(logits, words[[1, 3]], [1, 3])
    assert torch.equal(some[[0, 2]], logits[[0, 2]]) and torch.equal(some[[1, 3]], everyone[[1, 3]])
