"""Indexing on a real database: changed files by content hash, deleted files removed, one transaction
per file, so that a run that dies halfway and a rerun give exactly the chunks of one clean run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from indexing_helpers import FakeEmbedder, vector_of
from sqlalchemy import func, insert, select

from homeai.jobs.indexer import Indexer, IndexSpec, JobError
from homeai.search.matrix_cache import SearchIndex
from homeai.store.db import Store
from homeai.store.tables import ChunkRow, DocumentRow, utcnow

SPEC_SIZE, SPEC_OVERLAP = 6, 2


def write_folder(root: Path, num_files: int = 12) -> None:
    for i in range(num_files):
        sub = root / f"part{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i:02d}.txt").write_text(" ".join(f"file{i}-word{j}" for j in range(3 + i * 2)))


def spec(root: Path, collection: str = "docs") -> IndexSpec:
    return IndexSpec(str(root), collection, SPEC_SIZE, SPEC_OVERLAP)


async def chunk_set(store: Store, collection: str) -> list[tuple[str, int, str]]:
    """(document path, ordinal, text) of every chunk, sorted; duplicates would show twice."""
    cid = await store.collections.find(collection)
    assert store.sessions is not None
    async with store.sessions() as session:
        rows = await session.execute(
            select(DocumentRow.path, ChunkRow.ordinal, ChunkRow.text).join(ChunkRow.__table__,
                                                                           ChunkRow.document_id == DocumentRow.id)
            .where(DocumentRow.collection_id == cid))
        return sorted((p, o, t) for p, o, t in rows)


async def num_rows(store: Store, table: type) -> int:
    assert store.sessions is not None
    async with store.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table)) or 0)


async def test_index_then_nothing_to_do(store: Store, embedder: FakeEmbedder, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root)
    indexer = Indexer(store.collections, None, embedder, batch_chunks=4)
    outcome = await indexer.run(spec(root))
    chunks = await chunk_set(store, "docs")
    assert outcome.num_indexed == 12 and outcome.num_chunks == len(chunks) > 12
    assert indexer.progress.done_chunks == indexer.progress.total_chunks == len(chunks)
    assert all(len(b) <= 4 for b in embedder.batches)
    again = await Indexer(store.collections, None, embedder).run(spec(root))
    assert (again.num_indexed, again.num_unchanged, again.num_removed) == (0, 12, 0)
    assert await chunk_set(store, "docs") == chunks


async def test_changed_file_is_reindexed_and_deleted_file_removed(store: Store, embedder: FakeEmbedder,
                                                                  tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root)
    await Indexer(store.collections, None, embedder).run(spec(root))
    cid = await store.collections.find("docs")
    assert cid is not None
    version = await store.collections.version(cid)
    changed, deleted = root / "part0" / "doc03.txt", root / "part1" / "doc01.txt"
    changed.write_text("completely new words here")
    deleted.unlink()
    outcome = await Indexer(store.collections, None, embedder).run(spec(root))
    assert (outcome.num_indexed, outcome.num_removed, outcome.num_unchanged) == (1, 1, 10)
    chunks = await chunk_set(store, "docs")
    assert [c for c in chunks if c[0] == str(changed)] == [(str(changed), 0, "completely new words here")]
    assert not any(c[0] == str(deleted) for c in chunks)
    assert await store.collections.version(cid) == version + 2  # one commit, one removal
    assert await num_rows(store, ChunkRow) == len(chunks)  # the old chunks of the changed file are gone


async def test_other_folders_in_the_collection_stay(store: Store, embedder: FakeEmbedder, tmp_path: Path) -> None:
    write_folder(tmp_path / "a", 3)
    write_folder(tmp_path / "ab", 2)  # a sibling whose name starts like the first one
    await Indexer(store.collections, None, embedder).run(spec(tmp_path / "a"))
    await Indexer(store.collections, None, embedder).run(spec(tmp_path / "ab"))
    outcome = await Indexer(store.collections, None, embedder).run(spec(tmp_path / "a"))
    assert outcome.num_removed == 0
    docs = await store.collections.documents(await store.collections.ensure("docs"))
    assert len(docs) == 5


async def test_a_crash_mid_run_then_a_rerun_equals_a_clean_run(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root, 30)
    await Indexer(store.collections, None, FakeEmbedder()).run(spec(root, "clean"))
    crashing = FakeEmbedder(fail_after=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        await Indexer(store.collections, None, crashing, batch_chunks=4, max_in_flight=2).run(spec(root, "crashy"))
    partial = await chunk_set(store, "crashy")
    assert 0 < len({p for p, _, _ in partial}) < 30
    resumed = FakeEmbedder()
    outcome = await Indexer(store.collections, None, resumed, batch_chunks=4).run(spec(root, "crashy"))
    assert outcome.num_unchanged == len({p for p, _, _ in partial})
    assert await chunk_set(store, "crashy") == await chunk_set(store, "clean")
    redone = {t for batch in resumed.batches for t in batch}
    assert not redone & {t for _, _, t in partial}  # committed files were not embedded again


async def test_pause_stops_between_batches_and_resume_finishes(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root, 20)
    embedder = FakeEmbedder()
    first = Indexer(store.collections, None, embedder, batch_chunks=4)
    outcome = await first.run(spec(root), should_stop=lambda: len(embedder.batches) >= 2)
    assert outcome.stopped and 0 < outcome.num_indexed < 20
    assert first.progress.done_chunks < first.progress.total_chunks
    rest = await Indexer(store.collections, None, FakeEmbedder(), batch_chunks=4).run(spec(root))
    assert not rest.stopped and rest.num_indexed + outcome.num_indexed == 20


async def test_progress_is_committed_with_each_file(store: Store, embedder: FakeEmbedder, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root, 5)
    job = await store.jobs.create("index", {"path": str(root), "collection": "docs"}, None, "test")
    indexer = Indexer(store.collections, store.jobs, embedder, job.id)
    await indexer.run(spec(root))
    found = await store.jobs.get(job.id)
    assert found is not None
    assert (found.done_files, found.total_files) == (5, 5)
    assert found.done_chunks == found.total_chunks == indexer.progress.total_chunks > 0


async def test_a_file_above_the_size_limit_is_refused_unread(store: Store, embedder: FakeEmbedder, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a security review: a file was read, decoded and tokenized whole, so a few hundred MB dropped
    into a shared indexed folder took gigabytes at every run and the server was killed."""
    from homeai.jobs import scanning

    monkeypatch.setattr(scanning, "MAX_FILE_BYTES", 1000)
    root = tmp_path / "docs"
    root.mkdir()
    (root / "huge.txt").write_text("words " * 500)
    (root / "ok.md").write_text("fine text")
    outcome = await Indexer(store.collections, None, embedder).run(spec(root))
    assert len(outcome.failed) == 1 and "huge.txt" in outcome.failed[0] and "too large to index" in outcome.failed[0]
    assert [c[2] for c in await chunk_set(store, "docs")] == ["fine text"]


async def test_unreadable_files_and_missing_folder(store: Store, embedder: FakeEmbedder, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    (root / "ok.md").write_text("fine text")
    outcome = await Indexer(store.collections, None, embedder).run(spec(root))
    assert outcome.num_indexed == 2 and len(outcome.failed) == 1 and "broken.pdf" in outcome.failed[0]
    assert [c[2] for c in await chunk_set(store, "docs")] == ["fine text"]
    again = await Indexer(store.collections, None, embedder).run(spec(root))
    assert again.num_unchanged == 2  # the broken file is not retried until it changes
    with pytest.raises(JobError, match="not a folder"):
        await Indexer(store.collections, None, embedder).run(spec(tmp_path / "missing"))


async def test_vectors_round_trip_as_float32(store: Store, embedder: FakeEmbedder, tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_folder(root, 2)
    await Indexer(store.collections, None, embedder).run(spec(root))
    cid = await store.collections.find("docs")
    assert cid is not None
    data = await store.collections.vectors(cid)
    assert data.matrix.dtype == np.float32 and data.matrix.shape == (len(data.texts), embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(data.matrix, axis=1), 1.0, rtol=1e-5)


async def test_a_chunk_size_the_model_cuts_keeps_the_step_asked_for(store: Store, tmp_path: Path) -> None:
    """512-token chunks overlapping by 500 on a model that takes 254: the overlap was cut to 253, a 1-token
    step (747 chunks for a 1,000-token file); now the chunks are 254 tokens and step by 12, as asked."""
    root = tmp_path / "long"
    root.mkdir()
    (root / "doc.txt").write_text(" ".join(f"w{j}" for j in range(1000)))
    embedder = FakeEmbedder()
    await Indexer(store.collections, None, embedder).run(IndexSpec(str(root), "cut", 512, 500))
    chunks = await chunk_set(store, "cut")
    assert embedder.max_chunk_tokens == 254
    assert 50 <= len(chunks) <= 80  # (tokens - 254) / 12 + 1 of the file's ~1,000 tokens; 747 before


async def test_a_new_embedding_model_indexes_every_file_again_and_search_reads_only_its_vectors(
        store: Store, tmp_path: Path) -> None:
    """Files were re-indexed by content hash alone: after the embedding model changed, unchanged files kept
    the old model's vectors, the collection held two widths, and search reshaped them into rows of neither
    ("vectors have 10 dimensions") for good. Now a run with the new model indexes every file again, and
    until it has, search answers from the vectors of the query's width and says why when there are none."""
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(3):
        (root / f"old{i}.txt").write_text(f"old document number {i}")
    await Indexer(store.collections, None, FakeEmbedder(dim=8)).run(spec(root, "c"))
    cid = await store.collections.find("c")
    assert cid is not None
    index = SearchIndex(store.collections)
    with pytest.raises(ValueError, match="another embedding model: the collection holds vectors of 8 dimensions, "
                                         "the query is vectors of 16"):
        await index.search(cid, vector_of("old", 16), 3)
    (root / "new.txt").write_text("a new document")
    asked: list[bool] = []

    def after_the_first_batch() -> bool:
        asked.append(True)
        return len(asked) > 1

    half = await Indexer(store.collections, None, FakeEmbedder(dim=16), batch_chunks=1).run(
        spec(root, "c"), should_stop=after_the_first_batch)
    assert half.stopped  # a run stopped halfway: both widths are in the collection
    assert {w for _, w in await store.collections.vector_spaces(cid)} == {8, 16}
    hits = await index.search(cid, vector_of("a new document", 16), 10)
    assert hits and {h.document for h in hits} < {str(root / n) for n in ("old0.txt", "old1.txt", "old2.txt",
                                                                          "new.txt")}
    outcome = await Indexer(store.collections, None, FakeEmbedder(dim=16)).run(spec(root, "c"))
    assert outcome.num_unchanged == 0 and await store.collections.vector_spaces(cid) == {(None, 16)}
    assert len(await index.search(cid, vector_of("a new document", 16), 10)) == len(await chunk_set(store, "c"))


class NamedEmbedder(FakeEmbedder):
    """An encoder that says its name, as the gateway's does (two of them may have one width)."""

    def __init__(self, model: str, dim: int = 8) -> None:
        super().__init__(dim)
        self.model = model


async def test_another_encoder_of_the_same_width_indexes_again_and_search_keeps_to_its_model(
        store: Store, tmp_path: Path) -> None:
    """Two encoders of one width (MiniLM and a multilingual 384-dimension model) make vectors of the same
    shape that mean different things. Before: a policy that moved indexing to the other one kept every
    unchanged file's old vectors for good, and a query embedded by one was ranked against chunks of the other
    (noise, silently)."""
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(3):
        (root / f"doc{i}.txt").write_text(f"document number {i}")
    await Indexer(store.collections, None, NamedEmbedder("mini")).run(spec(root, "c"))
    cid = await store.collections.find("c")
    assert cid is not None and await store.collections.vector_spaces(cid) == {("mini", 8)}
    index = SearchIndex(store.collections)
    assert len(await index.search(cid, vector_of("document", 8), 5, model="mini")) == 3
    with pytest.raises(ValueError, match="holds model 'mini' \\(8 dimensions\\), the query is model 'multi'"):
        await index.search(cid, vector_of("document", 8), 5, model="multi")
    again = await Indexer(store.collections, None, NamedEmbedder("multi")).run(spec(root, "c"))
    assert again.num_unchanged == 0 and again.num_indexed == 3
    assert await store.collections.vector_spaces(cid) == {("multi", 8)}
    assert len(await index.search(cid, vector_of("document", 8), 5, model="multi")) == 3
    same = await Indexer(store.collections, None, NamedEmbedder("multi")).run(spec(root, "c"))
    assert same.num_unchanged == 3  # the same encoder: nothing to do


async def test_a_file_with_nul_bytes_is_indexed_and_the_files_after_it_too(store: Store, embedder: FakeEmbedder,
                                                                           tmp_path: Path) -> None:
    """PostgreSQL's text cannot hold NUL: one such file failed every run of its job, and the files after
    it were never indexed. Its NULs are dropped (SQLite took them as they were)."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_text("alpha words here")
    (root / "b.txt").write_bytes(b"some text\x00with a nul byte")
    (root / "c.txt").write_text("gamma words here")
    outcome = await Indexer(store.collections, None, embedder).run(spec(root))
    assert outcome.num_indexed == 3 and not outcome.failed
    texts = " ".join(t for _, _, t in await chunk_set(store, "docs"))
    assert "textwith" in texts and "\x00" not in texts


async def test_removing_more_documents_than_one_statement_takes(store: Store) -> None:
    """A moved folder of 40,000 files: PostgreSQL takes at most 32,767 parameters a statement, and the run
    failed the same way every time."""
    cid = await store.collections.ensure("big")
    assert store.sessions is not None
    async with store.sessions.begin() as session:
        await session.execute(insert(DocumentRow), [
            {"collection_id": cid, "path": f"f{i:05d}.txt", "sha256": "0" * 64, "mtime": 0.0, "num_chunks": 0,
             "indexed_at": utcnow()} for i in range(40_000)])
    assert await store.collections.remove_documents(cid, [f"f{i:05d}.txt" for i in range(40_000)] + ["gone"]) \
        == 40_000
    assert await num_rows(store, DocumentRow) == 0
