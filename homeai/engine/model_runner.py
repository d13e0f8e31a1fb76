"""Executes a step plan: builds the flat batch and attention metadata, runs the model, samples.

Everything for a step is assembled on the host as a few int tensors and moved to the device in one go;
the only device-to-host transfer is the sampled tokens (one sync per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from homeai.core.sequence import Sequence
from homeai.core.types import StepOutput, StepPlan
from homeai.runtime.decode_graph import CompiledDecode
from homeai.runtime.grammar import GrammarCache, SequenceGrammars
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import AttentionMetadata, LlamaModel, PrefillChunk
from homeai.runtime.quant import CPU_HAS_AMX
from homeai.runtime.sampler import GreedyPick, Sampler, make_generator

# Prompt chunks of more than one token attend through the paged prefill kernel where it serves (an AVX-512
# CPU): causal, straight from the cache, up to 16 query vectors in a register's lanes (kernels/
# prefill_attention.cpp). Before it, chunks up to 16 tokens (or rows x context up to 8,192) went through the
# decode kernel as one decode row per token, longer ones through SDPA over a gathered copy of their context.
# One layer, SmolLM2's heads, float16 cache, 2-core EPYC (decode rows / SDPA -> prefill kernel): 16 rows
# 18.9 / 62.7 -> 13.2 us, 46 rows 61.3 / 175 -> 36.4, 100 rows 222 / 412 -> 102, 512 rows 5,316 / 5,576 ->
# 2,015, 256 rows after 1,000 cached 8,062 / 7,464 -> 4,336. On a CPU with AMX, SDPA computes prompts in
# bfloat16 tiles and may win on long chunks (not measured: no AMX here): there, chunks whose rows times
# their context exceed this bound keep SDPA.
PREFILL_KERNEL_MAX_ROW_SLOTS = 64 * 128 if CPU_HAS_AMX else None


@dataclass(slots=True)
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_idx: torch.Tensor
    sample_seqs: list[Sequence]
    compiled_ok: bool = False  # every row a sampling decode: the compiled bucket may serve it


class ModelRunner:
    """Owns the model, the KV cache tensors, per-sequence random generators and grammar matchers."""

    def __init__(self, model: LlamaModel, cache: KVCache, grammars: GrammarCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.sampler = Sampler()
        self.grammars = grammars  # None: this model serves no constrained requests
        self._matchers = SequenceGrammars(grammars) if grammars is not None else None
        self._generators: dict[int, torch.Generator] = {}
        self.compiled: CompiledDecode | None = None  # set by the builder when decode steps are compiled
        self.compiled_steps = 0  # steps the compiled path served (the rest ran eager)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's generator and grammar matcher."""
        self._generators.pop(seq_id, None)
        if self._matchers is not None:
            self._matchers.reset(seq_id)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.is_greedy:
            return None
        gen = self._generators.get(seq.seq_id)
        if gen is None:
            gen = self._generators[seq.seq_id] = make_generator(seq.params.seed, self.device)
        return gen

    def prepare(self, plan: StepPlan, seqs: dict[int, Sequence]) -> BatchInputs:
        bs = self.cache.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_specs: list[tuple[int, int, int, list[int]]] = []  # (token_start, start, n, table)
        logits_idx: list[int] = []
        sample_seqs: list[Sequence] = []
        paged = self.model.paged_attention is not None
        prefill_kernel, limit = self.model.prefill_attention is not None, PREFILL_KERNEL_MAX_ROW_SLOTS
        paged_chunks: list[tuple[int, int, int, list[int]]] = []  # as prefill_specs, for prefill_attention
        for chunk in plan.chunks:
            seq = seqs[chunk.seq_id]
            table = chunk.block_table
            offset = len(ids)
            end = chunk.start + chunk.num_tokens
            if len(table) * bs < end:  # a plan not sealed, or a scheduler that planned KV it did not allocate
                raise ValueError(f"sequence {chunk.seq_id}: {len(table)} KV blocks for tokens up to {end}")
            ids.extend(seq.token_ids(chunk.start, end))
            for p in range(chunk.start, end):
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            # A prompt's last token alone (the rest found in the prefix cache) goes the prompt's way where the
            # prefill kernel serves: computed by the decode kernel instead (float32 over the cache, where a
            # quantized model's prompts attend in bfloat16 pairs), the same greedy request answered
            # differently once its prompt was cached. Each prompt row's result is its own, however the
            # prompt was chunked, so a cached prompt now gives the cold one's logits exactly.
            prompt_tail = prefill_kernel and chunk.start < seq.num_prompt_tokens and end <= (limit or end)
            if chunk.num_tokens == 1 and not prompt_tail:
                decode_rows.append(offset)
                decode_tables.append(table)
                decode_lens.append(end)
            elif prefill_kernel and (limit is None or chunk.num_tokens * end <= limit):
                paged_chunks.append((offset, chunk.start, chunk.num_tokens, table))
            else:
                prefill_specs.append((offset, chunk.start, chunk.num_tokens, table))
            if chunk.sample:
                logits_idx.append(offset + chunk.num_tokens - 1)
                sample_seqs.append(seq)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=_long(slots, dev))
        if decode_rows:
            # Built in numpy: a handful of small array ops, where torch's per-op dispatch was ~0.4 ms of a
            # one-row step (~6 ms).
            max_len = max(decode_lens)
            max_blocks = -(-max_len // bs)
            tables = np.zeros((len(decode_rows), max_blocks), dtype=np.int64)
            for i, t in enumerate(decode_tables):
                row = t[:max_blocks]
                tables[i, :len(row)] = row
            all_slots = (tables[:, :, None] * bs + np.arange(bs)).reshape(len(decode_rows), -1)[:, :max_len]
            lens = np.array(decode_lens, dtype=np.int64)
            meta.decode_token_idx = _long(decode_rows, dev)
            meta.decode_slots = torch.from_numpy(np.ascontiguousarray(all_slots)).to(dev)
            meta.decode_lens = torch.from_numpy(lens).to(dev)
            if not paged:  # SDPA over the gathered context needs the length mask
                valid = np.arange(max_len) < lens[:, None]
                meta.decode_mask = torch.from_numpy(valid).view(len(decode_rows), 1, 1, -1).to(dev)
            meta.all_decode = len(decode_rows) == len(ids)

        for token_start, start, n, table in paged_chunks:
            meta.prefills.append(PrefillChunk(token_start, n, _context_slots(table, start + n, bs, dev), None, start))
        for token_start, start, n, table in prefill_specs:
            if start == 0:
                meta.prefills.append(PrefillChunk(token_start, n, None, None))
                continue
            ctx = start + n
            ctx_pos = torch.arange(ctx)
            q_pos = torch.arange(start, ctx).unsqueeze(1)
            mask = ctx_pos.unsqueeze(0) <= q_pos  # [n, ctx]
            meta.prefills.append(PrefillChunk(token_start, n, _context_slots(table, ctx, bs, dev), mask.to(dev)))
        return BatchInputs(
            input_ids=_long(ids, dev),
            positions=_long(pos, dev),
            meta=meta,
            logits_idx=_long(logits_idx, dev),
            sample_seqs=sample_seqs,
            # Every token a decode row that samples: the compiled bucket computes logits for all its rows,
            # so a step with prompt tokens (rows that sample nothing) runs eager, which computes only the
            # sampled rows' logits. With the fused glue that is the faster path here (2-core EPYC, SmolLM2
            # int4: one decode beside a 12-token prompt 11.0 against 15.9 ms, eight beside 4 tokens 20.4
            # against 26.7; decodes alone stay faster compiled: one 5.4 against 6.6, eight 14.5 against 15.2).
            compiled_ok=meta.all_decode and len(logits_idx) == len(ids),
        )

    def _token_mask(self, seqs: list[Sequence], logits: torch.Tensor) -> tuple[torch.Tensor, list[int]] | None:
        """The grammar bitmask of the constrained rows (None when no row is constrained: no cost). Each
        row's budget goes with it, so that the grammar closes in time (near the end it checks the row's
        likeliest tokens in ``logits``)."""
        rows = [i for i, s in enumerate(seqs) if s.params.constraint is not None]
        if not rows or self._matchers is None:
            return None
        constraints = [c for c in (seqs[i].params.constraint for i in rows) if c is not None]
        budgets = [seqs[i].params.max_tokens - len(seqs[i].output_token_ids) for i in rows]
        bitmask = self._matchers.fill([seqs[i].seq_id for i in rows], constraints,
                                      [seqs[i].output_token_ids for i in rows], budgets, lambda j: logits[rows[j]])
        return bitmask, rows

    def _forward(self, batch: BatchInputs) -> tuple[torch.Tensor, GreedyPick | None]:
        """Logits of the sampled rows: a step of decodes only through its compiled bucket when one is ready
        (with each row's greedy pick), anything else eager (see ``prepare``'s ``compiled_ok``)."""
        meta = batch.meta
        compiled = self.compiled
        bucket = None
        if compiled is not None and batch.compiled_ok and meta.decode_lens is not None:
            bucket = compiled.bucket_for(batch.input_ids.shape[0])
        if bucket is None:
            return self.model(batch.input_ids, batch.positions, meta, self.cache, batch.logits_idx), None
        assert compiled is not None and meta.decode_slots is not None and meta.decode_lens is not None
        self.compiled_steps += 1
        out = compiled.run(bucket, batch.input_ids, batch.positions, meta.slot_mapping, meta.decode_slots,
                           meta.decode_lens)
        return out.logits, out.greedy  # one row per sequence, each sampling, in the plan's order

    def copy_reused_kv(self, plan: StepPlan) -> None:
        """Before the step: the keys and values a chunk reuses from a published block, where its cached
        prefix ends inside a block (``ScheduledChunk.kv_copy``), go into its own block."""
        for chunk in plan.chunks:
            if chunk.kv_copy is not None:
                self.cache.copy_prefix(*chunk.kv_copy)

    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        if self._matchers is not None:
            for seq_id in plan.preempted:  # recomputed later: the matcher replays its tokens then
                self._matchers.reset(seq_id)
        if plan.is_empty:
            return StepOutput()
        self.copy_reused_kv(plan)
        batch = self.prepare(plan, seqs)
        logits, greedy = self._forward(batch)
        out = StepOutput()
        if not batch.sample_seqs:
            return out
        ss = batch.sample_seqs
        # Filled after the forward pass is queued, so on a GPU the host writes masks while it computes.
        token_mask = self._token_mask(ss, logits)
        generators = [self._generator(s) for s in ss]
        # A seeded request's draws must not count twice: a step that fails after the noise was drawn runs
        # its sequences again alone, and each seeded generator would have moved on (another answer).
        states = [(g, g.get_state()) for s, g in zip(ss, generators, strict=True)
                  if g is not None and s.params.seed is not None]
        try:
            tokens, logprobs = self.sampler.sample(
                logits, [s.params for s in ss], [s.prompt_token_ids for s in ss],
                [s.output_token_ids for s in ss], generators, token_mask, greedy)
            tokens_list, logprobs_list = tokens.tolist(), logprobs.tolist()
        except BaseException:
            for generator, state in states:
                generator.set_state(state)
            raise
        for row, (seq, tok, lp) in enumerate(zip(ss, tokens_list, logprobs_list, strict=True)):
            out.sampled[seq.seq_id] = tok
            out.logprobs[seq.seq_id] = lp
            if row in self.sampler.last_top_logprobs:
                out.top_logprobs[seq.seq_id] = self.sampler.last_top_logprobs[row]
            if self._matchers is not None and seq.params.constraint is not None:
                self._matchers.advance(seq.seq_id, tok)
        return out


def _context_slots(table: list[int], end: int, block_size: int, device: torch.device) -> torch.Tensor:
    """The cache slot of each position 0 .. end - 1 of a sequence with block table ``table``."""
    seen = np.arange(end)
    return torch.from_numpy(np.asarray(table, dtype=np.int64)[seen // block_size] * block_size
                            + seen % block_size).to(device)


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of ``values`` on ``device`` (made on the host, moved in one copy)."""
    return torch.from_numpy(np.array(values, dtype=np.int64)).to(device)
