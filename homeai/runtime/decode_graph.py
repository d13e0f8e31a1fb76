"""Decode steps compiled per batch bucket: static shapes, a few fused kernels between the matmuls.

Why: a decode step of a small model is some twenty small ops per layer around four matmuls. In eager
PyTorch each op is a dispatch and, on the CPU, an OpenMP fork/join (on a GPU, a kernel launch), which
costs more than the arithmetic. ``torch.compile`` fuses the norms, RoPE, the cache write, the SiLU, the
residual adds and the greedy pick into a few generated kernels; matmuls and attention stay calls (on a
CPU with AVX-512 our native kernels, homeai.runtime.kernels), on the CPU made from a wrapper in C++.
Measured here (2-core CPU, SmolLM2-135M float32, ``homeai bench engine``): one stream 38.6 -> 43.7 tok/s,
16 streams 359 -> 402.

Batch sizes are padded up to a bucket (1, 2, 4, ... 64) so a handful of graphs serve every decode step;
padding rows write and read the cache's scratch block, which no sequence owns. On CUDA each bucket runs
as a CUDA graph (``mode="reduce-overhead"``, one per batch size as nano-vllm captures them) over a
context padded to the model's maximum length; on the CPU the context length stays a dynamic dimension
(one graph per bucket, padded to the block size). Prefill chunks, mixed steps and batches above the
largest bucket stay eager.

Compilation runs in a background thread at start; until a bucket is ready its steps run eager, and a
bucket that fails to compile stays eager (logged once). Inductor's caches live under the cache
directory, so a later start skips code generation. A stop lets the bucket being compiled finish; at
interpreter exit one still compiling is waited for (``homeai`` itself leaves with ``os._exit`` instead):
finalising Python while the thread ran inside Inductor's C++ code aborted the process (exit 134).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.sampler import GreedyPick, greedy_pick

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # compiled in this order: one stream and small batches come first
# On a CPU a step of more than 16 rows is mostly matmul time, where compiling the ops between them buys
# little; those buckets would cost minutes of compiling and resident graphs for it. They run eager.
CPU_BUCKETS = (1, 2, 4, 8, 16)
COMPILE_MODES = ("auto", "on", "off")
COMPILE_DECODE_ENV = "HOMEAI_COMPILE_DECODE"
SMALL_CPU_CORES = 4  # up to this many: Inductor compiles in this thread alone, no pool of compiler workers


def use_cache_dir(cache_dir: Path) -> None:
    """Keep Inductor's compiled code under our cache directory, where a second start finds it (Inductor's
    own default lies in /tmp, gone after a reboot). A directory the user chose stays; Inductor writes its
    default into the environment on first use, so that one does not count as chosen."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")


def compile_unavailable(device: torch.device) -> str | None:
    """None when torch.compile can build decode steps here, else why not (no C++ compiler on a CPU, no
    Triton on a GPU)."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    from torch._inductor import cpp_builder

    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - Inductor raises its own error types for a missing compiler
        return f"no C++ compiler ({type(exc).__name__}: {exc})"
    return None if shutil.which(compiler) else f"no C++ compiler ({compiler} not found)"


def compile_mode_from_env() -> str:
    """The compile mode a server or an engine gets when nobody passes one: HOMEAI_COMPILE_DECODE, else auto.
    Engines built in-process read it too, so one setting covers every engine of a process."""
    return os.environ.get(COMPILE_DECODE_ENV) or "auto"


def should_compile(mode: str, device: torch.device) -> bool:
    """Whether to compile decode steps: "off", else wherever torch.compile works here ("auto" and "on"
    alike: compiled steps are the faster ones on every device measured; the compilation runs in the
    background at low priority and is cached on disk). Where it cannot, says why once; steps stay eager."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile_decode must be one of {COMPILE_MODES}, not {mode!r}")
    if mode == "off":
        return False
    why = compile_unavailable(device)
    if why is not None:
        log.warning("decode steps run eager: %s", why)
        return False
    return True


def _yield_cpu_to_serving() -> None:
    """Make the calling (compiling) thread the least important on the CPU: lowest priority for it and the
    compiler processes it starts (Linux sets niceness per thread and children inherit it), and on a small
    CPU no pool of compiler workers beside the live steps."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: compile at normal priority
        log.debug("cannot lower the compile thread's priority: %s", exc)
    if (os.cpu_count() or 1) <= SMALL_CPU_CORES:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1


class DecodeOutput(NamedTuple):
    """A compiled step's logits [n, V] (float32) and, fused into the same kernels, each row's greedy pick."""

    logits: torch.Tensor
    greedy: GreedyPick


def decode_forward(model: LlamaModel, cos: torch.Tensor, sin: torch.Tensor, input_ids: torch.Tensor,
                   positions: torch.Tensor, slot_mapping: torch.Tensor, ctx_slots: torch.Tensor,
                   ctx_lens: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode token per row: logits [B, V] (float32), each row's argmax and its log-softmax. The same
    arithmetic as ``LlamaModel.forward`` written for the compiler (RoPE on real pairs: Inductor does not
    fuse complex arithmetic)."""
    cfg = model.cfg
    b = input_ids.shape[0]
    h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qk_size = (h + kvh) * d
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [B, 1, d/2]
    if model.paged_attention is None:  # SDPA over a gathered context needs the length mask
        valid = torch.arange(ctx_slots.shape[1], device=ctx_slots.device) < ctx_lens.unsqueeze(1)  # [B, L]
        mask = valid[:, None, None, :]  # [B, 1, 1, L]
    x = model.embed.embed(input_ids, model.dtype)
    for li, layer in enumerate(model.layers):
        hs = F.rms_norm(x, (cfg.hidden_size,), layer.attn_norm, cfg.rms_norm_eps)
        qkv = layer.qkv(hs)
        pairs = qkv[:, :qk_size].float().view(b, h + kvh, d // 2, 2)
        re, im = pairs[..., 0], pairs[..., 1]
        qk = torch.stack((re * c - im * s, re * s + im * c), -1).view(b, h + kvh, d).to(qkv.dtype)
        new_kv = torch.stack((qk[:, h:], qkv[:, qk_size:].view(b, kvh, d)), 1)  # [B, 2, kvh, d]
        # On the base tensor with a layer index: Inductor writes in place (a write into ``kv[li]``, a view,
        # would make it copy the whole cache).
        kv.index_put_((torch.full_like(slot_mapping, li), slot_mapping), new_kv.to(kv.dtype))
        if model.paged_attention is not None:  # the native kernel reads the context where it lies
            attn = model.paged_attention(qk[:, :h], kv, li, ctx_slots, ctx_lens)
        else:
            ctx = kv[li][ctx_slots].to(qk.dtype)  # [B, L, 2, kvh, d]
            attn = F.scaled_dot_product_attention(qk[:, :h].reshape(b, kvh, h // kvh, d),
                                                  ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2),
                                                  attn_mask=mask)
        x = x + layer.o(attn.reshape(b, h * d).to(x.dtype))
        x = model.mlp_residual(layer, x)
    x = F.rms_norm(x, (cfg.hidden_size,), model.final_norm, cfg.rms_norm_eps)
    logits = model.lm_head(x).float()
    pick = greedy_pick(logits)
    return logits, pick.tokens, pick.logprobs


def _raise_recompile_limits() -> None:
    """One entry per bucket (and per context specialisation) of the same function: more than dynamo's
    default of 8 recompiles. Dynamo's settings are per thread (context variables): call it in the thread
    that compiles."""
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))


def _skip_guards_on_the_model(entries: list[Any]) -> list[bool]:
    """Keep the guards on a step's inputs (the bucket's shapes, the cache), drop those on the model: its
    weights and settings never change while a CompiledDecode serves it, and checking some hundreds of
    weight tensors' metadata cost half a millisecond per step (a tenth of a one-row int4 step)."""
    return [not (entry.name == "model" or str(entry.name).startswith(("model.", "model[", "L['model']")))
            for entry in entries]


def compile_threads() -> set[threading.Thread]:
    """The background compilations still running: a process that must not wait for them leaves with
    ``os._exit`` (``homeai``'s commands do) rather than finalising Python under them."""
    return {c._thread for c in list(_started) if c._thread is not None and c.compiling()}


def _finish_compiling_at_exit() -> None:
    """At interpreter exit: no further bucket, and the one being compiled finishes before Python finalises
    (a thread torn down inside Inductor's C++ code aborted the process: "terminate called without an active
    exception")."""
    for compiled in list(_started):
        compiled.stop(timeout=None)


class CompiledDecode:
    """The compiled decode path of one model and its KV cache; ``run`` serves a ready bucket."""

    def __init__(self, model: LlamaModel, cache: KVCache, max_model_len: int, max_batch: int = 64,
                 cache_dir: Path | None = None, buckets: tuple[int, ...] | None = None,
                 static_context: bool | None = None) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.static_context = model.device.type == "cuda" if static_context is None else static_context
        bs = cache.block_size
        self.max_context = -(-max_model_len // bs) * bs
        if buckets is None:
            buckets = BUCKETS if model.device.type == "cuda" else CPU_BUCKETS
        fitting = [b for b in buckets if b < max_batch]
        top = next((b for b in buckets if b >= max_batch), None)  # the smallest that holds a full batch
        self.buckets = tuple(fitting + ([top] if top is not None else []))
        angles = torch.view_as_real(model.rope_table)
        self._cos, self._sin = angles[..., 0].contiguous(), angles[..., 1].contiguous()
        self._ready: set[int] = set()
        self.failed: str | None = None
        self.compile_seconds: dict[int, float] = {}
        if cache_dir is not None:
            use_cache_dir(cache_dir)
        _raise_recompile_limits()
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        options: dict[str, str | int | bool | Callable[..., Any]] = {"guard_filter_fn": _skip_guards_on_the_model}
        if self.device.type == "cpu":
            # The graph's wrapper (which calls the kernels, some 240 a step) in C++ rather than Python:
            # 5.8 -> 5.1 ms per one-row int4 step, 35.0 -> 34.3 at 16 rows (its compile doubles, once: cached).
            options["cpp_wrapper"] = True
        self._compiled = torch.compile(decode_forward, dynamic=False, mode=mode, options=options)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped_at: float | None = None  # time.monotonic() of the first stop

    # --- readiness -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Compile every bucket in a background thread at low priority (steps run eager meanwhile)."""
        self._thread = threading.Thread(target=self._compile_in_background, name="homeai-compile", daemon=True)
        _started.add(self)
        self._thread.start()

    def compiling(self) -> bool:
        """Whether the background compilation is still running."""
        return self._thread is not None and self._thread.is_alive()

    def _compile_in_background(self) -> None:
        _yield_cpu_to_serving()
        self.compile_all()

    def compile_all(self) -> None:
        for b in self.buckets:
            if self._stop.is_set() or not self.compile_bucket(b):
                return

    def request_stop(self) -> float:
        """Compile no further bucket (returns at once); the time.monotonic() of the first stop."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()
        return self._stopped_at

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Compile no further bucket; wait for the one being compiled until ``timeout`` after the first stop
        (None: until it is done), so that the device loop and the gateway stopping it in turn wait once.
        False when it goes on past the wait (see ``compile_threads``)."""
        stopped_at = self.request_stop()
        wait_s = None if timeout is None else max(0.0, stopped_at + timeout - time.monotonic())
        if self._thread is not None and wait_s != 0.0:
            self._thread.join(wait_s)
            if self.compiling():
                log.info("a decode bucket is still compiling %.0fs after the stop; it ends with this process",
                         time.monotonic() - stopped_at)
        return not self.compiling()

    def compile_bucket(self, batch: int) -> bool:
        """Compile (or load from Inductor's cache) the graph of one bucket; False once one has failed, or once
        the compilation is stopped."""
        if self.failed is not None:
            return False
        _raise_recompile_limits()  # this thread's settings: whoever calls compiles
        start = time.perf_counter()
        try:
            # Two context lengths, so a dynamic context dimension is settled here, not on a live step.
            for length in (2 * self.cache.block_size, 3 * self.cache.block_size):
                if self._stop.is_set():  # stopped between the two: the bucket stays eager
                    return False
                self._call(*self._scratch_inputs(batch, length))
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: stay eager
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("compiled decode disabled, steps stay eager: %s", self.failed)
            return False
        self.compile_seconds[batch] = time.perf_counter() - start
        self._ready.add(batch)
        log.info("compiled decode bucket %d ready in %.1fs", batch, self.compile_seconds[batch])
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background compilation ended; True when every bucket is ready."""
        if self._thread is not None:
            self._thread.join(timeout)
        return len(self._ready) == len(self.buckets)

    @property
    def ready_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._ready))

    def snapshot(self) -> dict[str, object]:
        """For /v1/stats: which buckets serve compiled, and why none will if compilation failed."""
        return {"buckets": list(self.buckets), "ready": list(self.ready_buckets), "failed": self.failed}

    def bucket_for(self, batch: int) -> int | None:
        """The bucket a decode step of ``batch`` rows runs in, or None (not ready yet, or too big)."""
        bucket = next((b for b in self.buckets if b >= batch), None)
        return bucket if bucket in self._ready else None

    # --- one step --------------------------------------------------------------------------------------

    def run(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            ctx_slots: torch.Tensor, ctx_lens: torch.Tensor) -> DecodeOutput:
        """Logits [n, V] and greedy picks of ``n`` decode rows (``ctx_slots`` [n, L] padded, ``ctx_lens``
        [n]), run padded to ``bucket`` rows and a context of whole blocks (or the maximum, for CUDA graphs)."""
        n, length = ctx_slots.shape
        padded_len = self.max_context if self.static_context else -(-length // self.cache.block_size) * \
            self.cache.block_size
        padded_len = max(padded_len, 2 * self.cache.block_size)  # the smallest length compiled for
        args = self._scratch_inputs(bucket, padded_len)
        args[0][:n], args[1][:n], args[2][:n] = input_ids, positions, slot_mapping
        args[3][:n, :length] = ctx_slots
        args[4][:n] = ctx_lens
        logits, tokens, logprobs = self._call(*args)
        return DecodeOutput(logits[:n], GreedyPick(tokens[:n], logprobs[:n]))

    def _scratch_inputs(self, batch: int, length: int) -> tuple[torch.Tensor, ...]:
        """Inputs of ``batch`` padding rows: token 0 at position 0, written to and reading the scratch slot."""
        dev, scratch = self.device, self.cache.scratch_slot
        ids = torch.zeros(batch, dtype=torch.long, device=dev)
        slots = torch.full((batch,), scratch, dtype=torch.long, device=dev)
        ctx = torch.full((batch, length), scratch, dtype=torch.long, device=dev)
        lens = torch.ones(batch, dtype=torch.long, device=dev)
        if not self.static_context:
            torch._dynamo.mark_dynamic(ctx, 1)
        return ids, ids.clone(), slots, ctx, lens

    def _call(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, ctx: torch.Tensor,
              lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Always in inference mode: the graphs are guarded on it, and a live step outside it would
        # recompile on the device thread.
        with torch.inference_mode():
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            return self._compiled(self.model, self._cos, self._sin, ids, positions, slots, ctx, lens,
                                  self.cache.kv)


_started: weakref.WeakSet[CompiledDecode] = weakref.WeakSet()  # a running thread keeps its CompiledDecode
# threading's exit hook (concurrent.futures uses it) runs before atexit's handlers, among them Inductor's,
# which shut down the compile workers that the bucket being compiled may still need.
getattr(threading, "_register_atexit", atexit.register)(_finish_compiling_at_exit)
