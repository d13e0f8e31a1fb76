"""Search collections: documents committed one per transaction with their chunks and vectors.

Every change to a collection (a document committed or removed) bumps its ``version`` in the same
transaction, so a reader that cached the collection's vectors knows when to load them again.

Who may search a collection: its owner (the user whose job built it), the users in its readers list
(``*``: anyone with a key), and admins. A collection made before owners existed has none: admins only,
until an admin shares it. ``CollectionAccess.may_search`` is the one place that decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from homeai.store.tables import ChunkRow, CollectionReaderRow, CollectionRow, DocumentRow, JobRow, utcnow

EVERYONE = "*"  # in a readers list: every authenticated caller may search
IN_BATCH = 1000  # values per IN (...) list: PostgreSQL's driver takes at most 32,767 parameters a statement


@dataclass(frozen=True, slots=True)
class CollectionAccess:
    """A collection's name, owner and readers: what a search checks before it reads any vector."""

    id: int
    name: str
    owner: str | None
    readers: tuple[str, ...]

    def may_search(self, user: str, is_admin: bool) -> bool:
        return is_admin or user == self.owner or user in self.readers or EVERYONE in self.readers


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """What a collection holds for a path."""

    id: int
    sha256: str
    num_chunks: int


@dataclass(frozen=True, slots=True)
class NewChunk:
    text: str
    num_tokens: int
    vector: np.ndarray  # [dim] float32, unit length


@dataclass(frozen=True, slots=True)
class CollectionVectors:
    """Everything a search over one collection needs, read in one go."""

    version: int
    texts: list[str]
    documents: list[str]
    matrix: np.ndarray  # [num_chunks, dim] float32


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


class Collections:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def ensure(self, name: str, owner: str | None = None) -> int:
        """The id of collection ``name``, created if missing (safe against a concurrent create) and
        then owned by ``owner``; an existing collection keeps its owner."""
        for _ in range(2):
            found = await self.find(name)
            if found is not None:
                return found
            try:
                async with self._sessions.begin() as session:
                    row = CollectionRow(name=name, version=0, created_at=utcnow(), owner=owner)
                    session.add(row)
                    await session.flush()
                    return row.id
            except IntegrityError:
                continue
        raise RuntimeError(f"cannot create collection {name!r}")

    async def find(self, name: str) -> int | None:
        async with self._sessions() as session:
            return await session.scalar(select(CollectionRow.id).where(CollectionRow.name == name))

    async def access(self, name: str) -> CollectionAccess | None:
        """Owner and readers of collection ``name`` (None if there is none)."""
        async with self._sessions() as session:
            row = await session.scalar(select(CollectionRow).where(CollectionRow.name == name))
            if row is None:
                return None
            readers = await session.scalars(select(CollectionReaderRow.user)
                                            .where(CollectionReaderRow.collection_id == row.id)
                                            .order_by(CollectionReaderRow.user))
            return CollectionAccess(row.id, row.name, row.owner, tuple(readers))

    async def all_access(self) -> list[CollectionAccess]:
        """Every collection with its owner and readers, by name."""
        async with self._sessions() as session:
            rows = list(await session.scalars(select(CollectionRow).order_by(CollectionRow.name)))
            pairs = (await session.execute(select(CollectionReaderRow.collection_id, CollectionReaderRow.user)
                                           .order_by(CollectionReaderRow.user))).all()
        readers: dict[int, list[str]] = {}
        for cid, user in pairs:
            readers.setdefault(cid, []).append(user)
        return [CollectionAccess(r.id, r.name, r.owner, tuple(readers.get(r.id, []))) for r in rows]

    async def set_readers(self, collection_id: int, users: Sequence[str]) -> None:
        """Replace the users (besides the owner and admins) who may search the collection."""
        async with self._sessions.begin() as session:
            await session.execute(delete(CollectionReaderRow).where(CollectionReaderRow.collection_id == collection_id))
            unique = sorted(set(users))
            if unique:
                await session.execute(insert(CollectionReaderRow), [
                    {"collection_id": collection_id, "user": user} for user in unique])

    async def version(self, collection_id: int) -> int:
        async with self._sessions() as session:
            return int(await session.scalar(select(CollectionRow.version).where(CollectionRow.id == collection_id))
                       or 0)

    async def documents(self, collection_id: int) -> dict[str, StoredDocument]:
        """path -> what is committed for it."""
        query = select(DocumentRow.path, DocumentRow.id, DocumentRow.sha256, DocumentRow.num_chunks).where(
            DocumentRow.collection_id == collection_id)
        async with self._sessions() as session:
            return {path: StoredDocument(id_, sha, n) for path, id_, sha, n in await session.execute(query)}

    async def commit_document(self, collection_id: int, path: str, sha256: str, mtime: float,
                              chunks: Sequence[NewChunk], job_id: int | None = None, model: str | None = None) -> int:
        """Replace the document's chunks and hash in one transaction (and count it in the job's progress);
        ``model``: the encoder that made the chunks' vectors."""
        async with self._sessions.begin() as session:
            doc = await session.scalar(select(DocumentRow).where(DocumentRow.collection_id == collection_id,
                                                                 DocumentRow.path == path))
            if doc is None:
                doc = DocumentRow(collection_id=collection_id, path=path, sha256=sha256, mtime=mtime,
                                  num_chunks=len(chunks), indexed_at=utcnow(), embedding_model=model)
                session.add(doc)
                await session.flush()
            else:
                await session.execute(delete(ChunkRow).where(ChunkRow.document_id == doc.id))
                doc.sha256, doc.mtime, doc.num_chunks, doc.indexed_at = sha256, mtime, len(chunks), utcnow()
                doc.embedding_model = model
            if chunks:
                await session.execute(insert(ChunkRow), [
                    {"document_id": doc.id, "ordinal": i, "text": c.text, "num_tokens": c.num_tokens,
                     "vector": vector_bytes(c.vector)} for i, c in enumerate(chunks)])
            await self._bump(session, collection_id)
            if job_id is not None:
                await session.execute(update(JobRow).where(JobRow.id == job_id).values(
                    done_chunks=JobRow.done_chunks + len(chunks), done_files=JobRow.done_files + 1))
            return doc.id

    async def remove_documents(self, collection_id: int, paths: Sequence[str]) -> int:
        """Drop documents (and their chunks) by path; returns how many went."""
        if not paths:
            return 0
        paths = list(paths)
        removed = 0
        async with self._sessions.begin() as session:  # one transaction, statements of at most IN_BATCH values:
            for start in range(0, len(paths), IN_BATCH):  # PostgreSQL takes at most 32,767 parameters
                ids = list(await session.scalars(select(DocumentRow.id).where(
                    DocumentRow.collection_id == collection_id, DocumentRow.path.in_(paths[start:start + IN_BATCH]))))
                if ids:
                    await session.execute(delete(ChunkRow).where(ChunkRow.document_id.in_(ids)))
                    await session.execute(delete(DocumentRow).where(DocumentRow.id.in_(ids)))
                    removed += len(ids)
            if removed:
                await self._bump(session, collection_id)
            return removed

    async def vectors(self, collection_id: int, dim: int | None = None, model: str | None = None) -> CollectionVectors:
        """Texts, document paths and the vector matrix of every chunk, with the version they belong to;
        with ``dim``, of the chunks whose vectors have that many dimensions only (a collection indexed with
        another embedding model before holds others until its documents are indexed again: reshaping
        vectors of two widths into one matrix made rows of neither); with ``model``, of the chunks that
        model embedded (or an unknown one, of that width: written before models were recorded)."""
        query = (select(ChunkRow.text, ChunkRow.vector, DocumentRow.path, DocumentRow.embedding_model)
                 .join(DocumentRow, ChunkRow.document_id == DocumentRow.id)
                 .where(DocumentRow.collection_id == collection_id)
                 .order_by(ChunkRow.document_id, ChunkRow.ordinal))
        async with self._sessions() as session:
            version = int(await session.scalar(
                select(CollectionRow.version).where(CollectionRow.id == collection_id)) or 0)
            rows = (await session.execute(query)).all()
        if dim is not None:
            rows = [r for r in rows if len(r[1]) == 4 * dim]
        if model is not None:
            rows = [r for r in rows if r[3] in (model, None)]
        texts = [r[0] for r in rows]
        documents = [r[2] for r in rows]
        if rows:
            matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), -1)
        else:
            matrix = np.zeros((0, dim or 0), dtype=np.float32)
        return CollectionVectors(version, texts, documents, matrix.astype(np.float32, copy=False))

    async def vector_spaces(self, collection_id: int) -> set[tuple[str | None, int]]:
        """(model, dimensions) of the collection's vectors: one pair unless its embedding model changed (the
        model None: written before models were recorded)."""
        query = (select(DocumentRow.embedding_model, func.length(ChunkRow.vector))
                 .join(DocumentRow, ChunkRow.document_id == DocumentRow.id)
                 .where(DocumentRow.collection_id == collection_id).distinct())
        async with self._sessions() as session:
            return {(model, int(n) // 4) for model, n in await session.execute(query)}

    async def documents_since(self, collection_id: int, since: datetime | None) -> list[str]:
        """Paths committed after ``since`` (all when None), oldest first (a digest of new documents)."""
        query = select(DocumentRow.path).where(DocumentRow.collection_id == collection_id)
        if since is not None:
            query = query.where(DocumentRow.indexed_at > since)
        async with self._sessions() as session:
            return list(await session.scalars(query.order_by(DocumentRow.indexed_at, DocumentRow.path)))

    @staticmethod
    async def _bump(session: AsyncSession, collection_id: int) -> None:
        await session.execute(update(CollectionRow).where(CollectionRow.id == collection_id).values(
            version=CollectionRow.version + 1))
