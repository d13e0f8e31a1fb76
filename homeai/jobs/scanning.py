"""What an indexing run has to do: the folder's files, their hashes, and how they differ from the
documents already committed to the collection (new, changed, unchanged, deleted).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from homeai.jobs.parsing import is_supported
from homeai.store.collections import StoredDocument

log = logging.getLogger(__name__)

# A file is read, decoded and tokenized whole (the tokenizer's offsets alone take ~100 B a token): one of a
# few hundred MB dropped into an indexed folder took gigabytes, and the server was killed at every run.
MAX_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class FoundFile:
    path: Path  # absolute
    mtime: float
    size: int
    real_root: Path | None = None  # the job's folder, symbolic links resolved: reads stay below it

    def read(self, limit: int | None = None) -> bytes:
        """The file's bytes, checked again at read time (a link may have been swapped since the scan), and
        refused above ``limit`` (``MAX_FILE_BYTES``) without reading them."""
        limit = MAX_FILE_BYTES if limit is None else limit
        if self.real_root is not None and not stays_inside(self.path, self.real_root):
            raise PermissionError(f"{self.path} links outside the job's folder")
        with self.path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise OSError(errno.EFBIG, f"too large to index: {max(size, len(data)):,} bytes, more than "
                                       f"{limit:,}")
        return data


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scan_folder(root: Path) -> list[FoundFile]:
    """Supported files under ``root`` (recursive, sorted by path); hidden files and folders are skipped,
    symbolic links to folders are not followed, and a file whose real path lies outside ``root`` (a
    symbolic link to ``/etc/passwd``, say) is skipped: an index job reads its folder and nothing else,
    or any key could search what the link points at."""
    found: list[FoundFile] = []
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or not is_supported(path):
                continue
            if not stays_inside(path, real_root):
                log.warning("not indexing %s: it links outside the job's folder %s", path, root)
                continue
            try:
                stat = path.stat()
            except OSError:  # vanished or unreadable meanwhile
                continue
            if path.is_file():
                found.append(FoundFile(path, stat.st_mtime, stat.st_size, real_root))
    return sorted(found, key=lambda f: str(f.path))


def stays_inside(path: Path, real_root: Path) -> bool:
    """Whether ``path``, every symbolic link followed, is ``real_root`` or below it."""
    try:
        return path.resolve(strict=True).is_relative_to(real_root)
    except (OSError, RuntimeError):  # a dangling link or a loop: nothing to read
        return False


def is_under(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip(os.sep) + os.sep)


def deleted_paths(stored: Iterable[str], root: Path, present: set[str]) -> list[str]:
    """Committed paths under ``root`` with no file any more (paths of other folders are left alone)."""
    return sorted(p for p in stored if is_under(p, root) and p not in present)


def diff_file(file: FoundFile, stored: Mapping[str, StoredDocument], data: bytes) -> str | None:
    """The content hash if the file must be (re-)indexed, None when the committed hash is the same."""
    sha = sha256_bytes(data)
    known = stored.get(str(file.path))
    return None if known is not None and known.sha256 == sha else sha

