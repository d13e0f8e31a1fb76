"""Batched next-token sampling: penalties, temperature, top-k / top-p / min-p, then a per-row race.

Sampling uses the exponential race: ``argmax(probs / q)`` with ``q ~ Exp(1)`` picks token i with
probability p_i. Each row draws its own noise from its own generator, so a seeded request gets the
same tokens whatever its batch neighbours are (``torch.multinomial`` over the batch would share one
random stream). Everything else is one tensor op over the whole batch; work no row needs is skipped,
and the host sees the result through a single device->host copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from homeai.core.types import SamplingParams


@dataclass(frozen=True, slots=True)
class GreedyPick:
    """Each row's argmax and its log-softmax there, computed where the logits are made.

    The compiled decode step fuses these two reductions into the pass that writes the logits; a step
    whose rows are all plain greedy then skips three more passes over [N, V] (argmax, logsumexp, gather:
    ~5 ms of an 87 ms 32-row step on a 2-core CPU)."""

    tokens: Tensor  # [N] long
    logprobs: Tensor  # [N] float32


def greedy_pick(logits: Tensor) -> GreedyPick:
    """The argmax of each row and its log-softmax value (max - logsumexp)."""
    return GreedyPick(logits.argmax(dim=-1), logits.amax(dim=-1) - logits.logsumexp(dim=-1))


def argmax_logsumexp(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's argmax (its first maximum) and logsumexp: one native pass per row on a CPU with AVX-512
    (torch's CPU argmax walks a row one element at a time: 43 us for 49,152 logits), torch elsewhere."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.shape[1] > 0:
        from homeai.runtime.kernels import argmax_logsumexp as native

        op = native()
        if op is not None:
            return op(logits)
    return logits.argmax(dim=-1), logits.logsumexp(dim=-1)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A request's own random stream on ``device``; a nondeterministic seed when ``seed`` is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _count_ids(rows: list[list[int]], vocab_size: int, device: torch.device) -> Tensor:
    """Occurrences of each id per row, [N, V] float, by one scatter_add over a padded id tensor."""
    width = max((len(row) for row in rows), default=0)
    counts = torch.zeros(len(rows), vocab_size + 1, device=device)
    if width == 0:
        return counts[:, :vocab_size]
    # Padding points at an extra column (vocab_size) that is cut off afterwards.
    padded = torch.tensor([row + [vocab_size] * (width - len(row)) for row in rows], dtype=torch.long)
    if device.type == "cuda":
        padded = padded.pin_memory()
    ids = padded.to(device, non_blocking=True)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))
    return counts[:, :vocab_size]


def _column(values: list[float], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _last(prompt: list[int], output: list[int], n: int) -> list[int]:
    """The last ``n`` tokens of prompt + output (all of them when ``n`` < 0), which the repetition penalty
    looks back on."""
    if n < 0:
        return prompt + output
    if n <= len(output):
        return output[len(output) - n:]
    return prompt[max(0, len(prompt) - (n - len(output))):] + output


def apply_penalties(
    logits: Tensor, params: list[SamplingParams], prompt_ids: list[list[int]], output_ids: list[list[int]]
) -> Tensor:
    """Repetition (CTRL/HF, the last ``repeat_last_n`` of prompt + output), then frequency and presence
    (OpenAI, output only).

    Returns a new tensor (or ``logits`` itself when no row asks for a penalty).
    """
    vocab_size = logits.shape[1]
    device = logits.device
    if any(p.repetition_penalty != 1.0 for p in params):
        rows = [
            _last(prompt, output, p.repeat_last_n) if p.repetition_penalty != 1.0 else []
            for p, prompt, output in zip(params, prompt_ids, output_ids, strict=True)
        ]
        seen = _count_ids(rows, vocab_size, device) > 0
        penalty = _column([p.repetition_penalty for p in params], device)
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalized, logits)
    if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
        rows = [
            output if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) else []
            for p, output in zip(params, output_ids, strict=True)
        ]
        counts = _count_ids(rows, vocab_size, device)
        frequency = _column([p.frequency_penalty for p in params], device)
        presence = _column([p.presence_penalty for p in params], device)
        logits = logits - counts * frequency - (counts > 0).float() * presence
    return logits


def _top_k_top_p(logits: Tensor, top_ks: list[int], top_ps: list[float]) -> Tensor:
    """Mask everything outside each row's top-k, then outside its top-p nucleus, with one sort."""
    device = logits.device
    vocab_size = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if any(k < vocab_size for k in top_ks):
        ks = torch.tensor(top_ks, dtype=torch.long, device=device).unsqueeze(1)
        rank = torch.arange(vocab_size, device=device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(rank >= ks, -math.inf)
    if any(p < 1.0 for p in top_ps):
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens; the best always stays
        ps = _column([p if p < 1.0 else math.inf for p in top_ps], device)
        sorted_logits = sorted_logits.masked_fill(before > ps, -math.inf)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_filters(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Temperature, top-k, top-p, min-p (HF order) on sampling rows; greedy rows pass through unchanged."""
    device = logits.device
    vocab_size = logits.shape[1]
    sampling = [not p.is_greedy for p in params]
    temperatures = [p.temperature if s else 1.0 for p, s in zip(params, sampling, strict=True)]
    if any(t != 1.0 for t in temperatures):
        logits = logits / _column(temperatures, device)
    top_ks = [
        min(p.top_k, vocab_size) if s and p.top_k > 0 else vocab_size
        for p, s in zip(params, sampling, strict=True)
    ]
    top_ps = [p.top_p if s else 1.0 for p, s in zip(params, sampling, strict=True)]
    if any(k < vocab_size for k in top_ks) or any(p < 1.0 for p in top_ps):
        logits = _top_k_top_p(logits, top_ks, top_ps)
    min_ps = [p.min_p if s else 0.0 for p, s in zip(params, sampling, strict=True)]
    if any(m > 0.0 for m in min_ps):
        # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p): no softmax needed.
        floor = logits.max(dim=-1, keepdim=True).values + _column(min_ps, device).log()
        logits = logits.masked_fill(logits < floor, -math.inf)
    return logits


def _race(logits: Tensor, rows: list[int], index: Tensor, generators: list[torch.Generator | None]) -> Tensor:
    """Sample the given rows: argmax(probs / q), q ~ Exp(1) drawn from each row's own generator."""
    probs = logits.index_select(0, index).softmax(dim=-1)
    noise = torch.empty_like(probs)
    if all(generators[row] is None for row in rows):
        noise.exponential_()
    else:
        for j, row in enumerate(rows):
            noise[j].exponential_(generator=generators[row])  # [V] draws, whatever the batch
    # Exp(1) can round to 0 in float32; a tiny floor keeps 0/0 (a masked token) from becoming NaN.
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


def apply_token_mask(logits: Tensor, bitmask: Tensor, rows: list[int]) -> Tensor:
    """Mask the tokens a grammar forbids in ``rows``: bit j % 32 of ``bitmask[i]`` word j // 32 allows token j.

    Returns a new tensor; other rows are untouched, so an unconstrained neighbour samples as if alone.
    """
    num_rows, vocab_size = logits.shape
    everyone = rows == list(range(num_rows))  # the usual case when all streams are constrained: no gather
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    picked = logits if everyone else logits.index_select(0, index)
    if logits.device.type == "cpu":
        masked = _mask_on_cpu(picked, bitmask)
    else:
        masked = picked.masked_fill(~unpack_bitmask(bitmask, vocab_size, logits.device), -math.inf)
    return masked if everyone else logits.index_copy(0, index, masked)


def _mask_on_cpu(logits: Tensor, bitmask: Tensor) -> Tensor:
    """Writes only the smaller side: the few allowed tokens into rows of -inf (inside a JSON number), or
    -inf over the few forbidden ones (inside a string). Only the 32-bit words that hold such tokens are
    unpacked, so a step costs little more than copying the logits (a dense pass costs ~5x more here)."""
    num_rows, vocab_size = logits.shape
    words = bitmask.numpy()
    few_allowed = np.count_nonzero(words) <= np.count_nonzero(~words)
    flat_words = (words if few_allowed else ~words).reshape(-1)
    hit = np.flatnonzero(flat_words)  # words holding at least one token of the side we write
    bits = np.unpackbits(flat_words[hit].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    which, bit = np.nonzero(bits)
    token = (hit[which] % words.shape[1]) * 32 + bit
    row = hit[which] // words.shape[1]
    keep = token < vocab_size
    index = torch.from_numpy(row[keep] * vocab_size + token[keep])
    flat = logits.reshape(-1)
    if few_allowed:
        out = torch.from_numpy(np.full((num_rows, vocab_size), -np.inf, dtype=np.float32))
        out.view(-1)[index] = flat[index]
        return out
    out = logits.clone(memory_format=torch.contiguous_format)
    out.view(-1)[index] = -math.inf
    if 32 * words.shape[1] < vocab_size:  # logits wider than the tokenizer's vocabulary: padding, forbidden
        out[:, 32 * words.shape[1]:] = -math.inf
    return out


def unpack_bitmask(bitmask: Tensor, vocab_size: int, device: torch.device) -> Tensor:
    """[rows, W] int32 words -> [rows, vocab_size] bool (allowed), on ``device``."""
    byte_bits = torch.tensor([1 << k for k in range(8)], dtype=torch.uint8, device=device)
    words = bitmask.to(device, non_blocking=True).contiguous().view(torch.uint8)
    allowed = (words.unsqueeze(-1) & byte_bits).view(bitmask.shape[0], -1).bool()
    if allowed.shape[1] < vocab_size:  # logits wider than the tokenizer's vocabulary: padding
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]), value=False)
    return allowed[:, :vocab_size]


def _to_host(tokens: Tensor, logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """One device->host copy: the float32 logprobs travel as their int32 bit pattern beside the ids."""
    bits = logprobs.float().contiguous().view(torch.int32).long()
    packed = torch.stack([tokens.long(), bits]).cpu()
    return packed[0], packed[1].int().view(torch.float32)


def top_logprobs(logprobs: Tensor, params: list[SamplingParams]) -> dict[int, list[tuple[int, float]]]:
    """Row -> the k most likely (token id, logprob) pairs, for the rows that ask for k > 0 alternatives."""
    rows = [i for i, p in enumerate(params) if p.logprobs]
    if not rows:
        return {}
    k = max(params[i].logprobs or 0 for i in rows)
    index = torch.tensor(rows, dtype=torch.long, device=logprobs.device)
    top = logprobs.index_select(0, index).topk(k, dim=-1)
    values: list[list[float]] = top.values.cpu().tolist()
    ids: list[list[int]] = top.indices.cpu().tolist()
    return {row: list(zip(ids[j][: params[row].logprobs], values[j][: params[row].logprobs], strict=True))
            for j, row in enumerate(rows)}


class Sampler:
    """Turns one step's logits into the next token of every sequence that samples."""

    last_top_logprobs: dict[int, list[tuple[int, float]]]

    def __init__(self) -> None:
        self.last_top_logprobs = {}

    def sample(
        self,
        logits: Tensor,
        params: list[SamplingParams],
        prompt_ids: list[list[int]],
        output_ids: list[list[int]],
        generators: list[torch.Generator | None],
        token_mask: tuple[Tensor, list[int]] | None = None,
        greedy: GreedyPick | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Pick tokens for logits [N, V]; returns (token ids [N] long, logprobs [N] float) on the CPU.

        ``token_mask`` (a grammar bitmask and the rows it covers) forbids tokens before anything else.
        A logprob is the log-softmax, at the chosen token, of the distribution actually sampled from
        (after the mask, penalties, temperature and filters); for a greedy row, of the penalized logits.
        Rows that ask for top alternatives find them in ``last_top_logprobs`` (same distribution).
        ``greedy`` (the raw logits' argmax and log-softmax there) answers a step whose rows are all
        greedy with no mask, penalty or alternatives. The input ``logits`` is never modified.
        """
        self.last_top_logprobs = {}
        if logits.shape[0] == 0:
            return torch.empty(0, dtype=torch.long), torch.empty(0)
        raw = logits = logits.float()
        if token_mask is not None:
            logits = apply_token_mask(logits, *token_mask)
        logits = apply_penalties(logits, params, prompt_ids, output_ids)
        sampling_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        wants_alternatives = any(p.logprobs for p in params)
        if greedy is not None and logits is raw and not sampling_rows and not wants_alternatives:
            return _to_host(greedy.tokens, greedy.logprobs)  # the distribution is the raw logits'
        if sampling_rows:
            logits = apply_filters(logits, params)
        tokens, lse = argmax_logsumexp(logits)
        if sampling_rows:
            index = torch.tensor(sampling_rows, dtype=torch.long, device=logits.device)
            picks = _race(logits, sampling_rows, index, generators)
            tokens = tokens.index_copy(0, index, picks)
        if wants_alternatives:
            distribution = logits.log_softmax(dim=-1)
            self.last_top_logprobs = top_logprobs(distribution, params)
            logprobs = distribution.gather(1, tokens.unsqueeze(1)).squeeze(1)
        else:
            logprobs = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse
        return _to_host(tokens, logprobs)
