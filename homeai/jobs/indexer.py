"""Index a folder into a collection: plan (hash every file, find new, changed and deleted ones), then
embed new chunks in batches and commit each file in its own transaction.

A file's chunks and its content hash are committed together, so after a crash (even SIGKILL) the next
run finds every committed file unchanged and skips it, and a half-done file left nothing behind: no
chunk is lost or duplicated. Embeddings are asked of the gateway (``TextEmbedder``), never of a model.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from homeai.jobs.chunking import DEFAULT_OVERLAP_TOKENS, DEFAULT_SIZE_TOKENS, Chunk, chunk_text
from homeai.jobs.parsing import ParseError, extract_text
from homeai.jobs.pause_point import pause_after_files
from homeai.jobs.progress import Progress
from homeai.jobs.scanning import FoundFile, deleted_paths, diff_file, scan_folder
from homeai.store.collections import Collections, NewChunk, StoredDocument
from homeai.store.jobs import Jobs

log = logging.getLogger(__name__)


class JobError(ValueError):
    """A job that cannot run as specified (a folder that does not exist, say)."""


class TextEmbedder(Protocol):
    """What indexing needs of the embedding model: its token offsets and unit vectors for texts."""

    max_chunk_tokens: int
    dim: int  # the vectors' dimensions

    def token_offsets(self, text: str) -> list[tuple[int, int]]: ...

    async def embed(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class IndexSpec:
    path: str
    collection: str
    chunk_tokens: int = DEFAULT_SIZE_TOKENS
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS

    def folder(self) -> Path:
        """The absolute folder; JobError when it is not one (any more)."""
        root = Path(self.path).expanduser().resolve()
        if not root.is_dir():
            raise JobError(f"path {str(root)!r} is not a folder")
        return root


@dataclass(slots=True)
class _Pending:
    file: FoundFile
    sha256: str
    num_chunks: int
    chunks: list[Chunk] | None  # None: dropped from memory, read again before embedding
    error: str | None = None


@dataclass(slots=True)
class IndexOutcome:
    num_indexed: int = 0
    num_unchanged: int = 0
    num_removed: int = 0
    num_chunks: int = 0
    failed: list[str] = field(default_factory=list)  # "path: reason" of files that gave no text
    stopped: bool = False  # paused before the end

    def summary(self) -> str:
        text = (f"{self.num_indexed} files indexed ({self.num_chunks} chunks), {self.num_unchanged} unchanged, "
                f"{self.num_removed} removed")
        return text + (f", {len(self.failed)} unreadable" if self.failed else "")


class Indexer:
    """One indexing run over ``spec``; ``should_stop`` is polled between batches (pause)."""

    def __init__(self, collections: Collections, jobs: Jobs | None, embedder: TextEmbedder,
                 job_id: int | None = None, progress: Progress | None = None, batch_chunks: int = 32,
                 max_in_flight: int = 2, max_cached_chars: int = 32_000_000) -> None:
        self.collections = collections
        self.jobs = jobs
        self.embedder = embedder
        self.job_id = job_id
        self.progress = progress or Progress()
        self.batch_chunks = batch_chunks
        self.max_in_flight = max_in_flight
        self.max_cached_chars = max_cached_chars
        self._cached_chars = 0

    async def run(self, spec: IndexSpec, should_stop: Callable[[], bool] = lambda: False) -> IndexOutcome:
        root = spec.folder()
        size = min(spec.chunk_tokens, self.embedder.max_chunk_tokens)
        # A size the model cuts keeps the step asked for (chunk - overlap): cutting the overlap to size - 1
        # instead made 512/500 on MiniLM's 254 a 1-token step, ~18x the chunks (and the embedding work).
        step = max(1, spec.chunk_tokens - spec.overlap_tokens)
        overlap = max(0, min(spec.overlap_tokens, size - step))
        cid = await self.collections.ensure(spec.collection)
        stored = await self.collections.documents(cid)
        files = await asyncio.to_thread(scan_folder, root)
        outcome = IndexOutcome()
        gone = deleted_paths(stored, root, {str(f.path) for f in files})
        outcome.num_removed = await self.collections.remove_documents(cid, gone)
        if await self._other_model_indexed(cid):
            # Indexed with another embedding model before: an unchanged file's vectors are of no use to a
            # query now, so every file is indexed again (its content hash alone kept them for good).
            log.info("collection %r holds vectors of another embedding model: indexing every file again",
                     spec.collection)
            stored = {}
        pending = await self._plan(files, stored, size, overlap, outcome)
        await self._save_progress()
        self.progress.begin_indexing()
        outcome.stopped = await self._index(cid, pending, size, overlap, outcome, should_stop)
        if not outcome.stopped:
            self.progress.phase = "done"
        return outcome

    async def _other_model_indexed(self, cid: int) -> bool:
        """Vectors of another width, or of another encoder of this width (same shape, other meaning); a
        document of unknown model (written before models were recorded) counts by its width alone."""
        dim, model = self.embedder.dim, self.model
        return any(w != dim or (m is not None and model is not None and m != model)
                   for m, w in await self.collections.vector_spaces(cid))

    @property
    def model(self) -> str | None:
        """The encoder the vectors come from (None: an embedder that does not say, as tests' do)."""
        return getattr(self.embedder, "model", None)

    # ---- 1. plan: which files need work, and how many chunks in all ------------------------------
    async def _plan(self, files: list[FoundFile], stored: dict[str, StoredDocument], size: int, overlap: int,
                    outcome: IndexOutcome) -> list[_Pending]:
        progress = self.progress
        progress.total_files = len(files)
        pending: list[_Pending] = []
        for file in files:
            item = await asyncio.to_thread(self._prepare, file, stored, size, overlap)
            if item is None:
                known = stored[str(file.path)]
                progress.done_chunks += known.num_chunks
                progress.total_chunks += known.num_chunks
                progress.done_files += 1
                outcome.num_unchanged += 1
            else:
                pending.append(item)
                progress.total_chunks += item.num_chunks
        return pending

    def _prepare(self, file: FoundFile, stored: dict[str, StoredDocument], size: int, overlap: int,
                 ) -> _Pending | None:
        """Worker thread: read, hash, and (when the content is new) parse and chunk one file."""
        try:
            data = file.read()  # never through a link that now points outside the folder
        except OSError as e:
            return _Pending(file, "", 0, [], f"cannot read: {e}")
        sha = diff_file(file, stored, data)
        if sha is None:
            return None
        chunks, error = self._chunks(file.path, data, size, overlap)
        keep = self._cached_chars + sum(len(c.text) for c in chunks) <= self.max_cached_chars
        if keep:
            self._cached_chars += sum(len(c.text) for c in chunks)
        return _Pending(file, sha, len(chunks), chunks if keep else None, error)

    def _chunks(self, path: Path, data: bytes, size: int, overlap: int) -> tuple[list[Chunk], str | None]:
        try:
            text = extract_text(path, data)
        except ParseError as e:
            return [], str(e)
        return chunk_text(text, self.embedder.token_offsets, size, overlap), None

    # ---- 2. index: embed batches (a few in flight), commit file by file ---------------------------
    async def _index(self, cid: int, pending: list[_Pending], size: int, overlap: int, outcome: IndexOutcome,
                     should_stop: Callable[[], bool]) -> bool:
        in_flight: deque[tuple[list[_Pending], asyncio.Task[np.ndarray]]] = deque()
        stopped = False
        try:
            for group in self._groups(pending):
                if should_stop():
                    stopped = True
                    break
                for item in group:
                    if item.chunks is None:
                        await asyncio.to_thread(self._reload, item, size, overlap)
                texts = [c.text for item in group for c in item.chunks or []]
                in_flight.append((group, asyncio.create_task(self._embed(texts))))
                if len(in_flight) >= self.max_in_flight:
                    await self._commit(cid, *in_flight.popleft(), outcome)
            while in_flight:
                await self._commit(cid, *in_flight.popleft(), outcome)
        finally:
            for _, task in in_flight:
                task.cancel()
        return stopped

    def _groups(self, pending: list[_Pending]) -> Iterator[list[_Pending]]:
        """Consecutive files whose chunks make about one batch (a big file is a group of its own)."""
        group: list[_Pending] = []
        num_chunks = 0
        for item in pending:
            group.append(item)
            num_chunks += item.num_chunks
            if num_chunks >= self.batch_chunks:
                yield group
                group, num_chunks = [], 0
        if group:
            yield group

    def _reload(self, item: _Pending, size: int, overlap: int) -> None:
        """Worker thread: read a file again whose chunks were not kept (its content may have changed)."""
        try:
            data = item.file.read()
        except OSError as e:
            item.chunks, item.error = [], f"cannot read: {e}"
            return
        item.sha256 = diff_file(item.file, {}, data) or item.sha256
        item.chunks, item.error = self._chunks(item.file.path, data, size, overlap)
        self.progress.total_chunks += len(item.chunks) - item.num_chunks

    async def _embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        batches = [texts[i:i + self.batch_chunks] for i in range(0, len(texts), self.batch_chunks)]
        parts = await asyncio.gather(*(self.embedder.embed(batch) for batch in batches))
        return np.concatenate(parts, axis=0)

    async def _commit(self, cid: int, group: list[_Pending], task: asyncio.Task[np.ndarray],
                      outcome: IndexOutcome) -> None:
        vectors = await task
        at = 0
        for item in group:
            chunks = item.chunks or []
            rows = [NewChunk(c.text, c.num_tokens, vectors[at + i]) for i, c in enumerate(chunks)]
            at += len(chunks)
            await self.collections.commit_document(cid, str(item.file.path), item.sha256, item.file.mtime, rows,
                                                   self.job_id if self.jobs is not None else None, self.model)
            self.progress.add(len(rows))
            outcome.num_indexed += 1
            outcome.num_chunks += len(rows)
            if item.error:
                outcome.failed.append(f"{item.file.path}: {item.error}")
                log.warning("indexing %s: %s", item.file.path, item.error)
            await pause_after_files(outcome.num_indexed)  # test-only: a place to SIGKILL at

    async def _save_progress(self) -> None:
        if self.jobs is None or self.job_id is None:
            return
        p = self.progress
        await self.jobs.update(self.job_id, done_chunks=p.done_chunks, total_chunks=p.total_chunks,
                               done_files=p.done_files, total_files=p.total_files)
