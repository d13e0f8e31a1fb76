"""Folder scans, content hashes, and which committed documents are new, changed, unchanged or gone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from homeai.jobs.scanning import deleted_paths, diff_file, is_under, scan_folder, sha256_bytes
from homeai.store.collections import StoredDocument


def make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.md").write_text("beta")
    (root / "sub" / "deeper" / "c.html").write_text("<p>gamma</p>")
    (root / "image.png").write_bytes(b"\x89PNG")
    (root / ".secret.txt").write_text("hidden")
    (root / ".hidden" / "d.txt").write_text("hidden")


def test_scan_is_recursive_sorted_and_skips_hidden_and_unsupported(tmp_path: Path) -> None:
    make_tree(tmp_path)
    found = [f.path.relative_to(tmp_path).as_posix() for f in scan_folder(tmp_path)]
    assert found == ["a.txt", "sub/b.md", "sub/deeper/c.html"]


def test_hash_is_sha256_of_the_content() -> None:
    assert sha256_bytes(b"abc") == hashlib.sha256(b"abc").hexdigest()


def test_new_changed_unchanged_and_deleted(tmp_path: Path) -> None:
    make_tree(tmp_path)
    files = scan_folder(tmp_path)
    a, b, c = (str(f.path) for f in files)
    stored = {
        a: StoredDocument(1, sha256_bytes(b"alpha"), 1),  # unchanged
        b: StoredDocument(2, sha256_bytes(b"old beta"), 1),  # changed
        str(tmp_path / "gone.txt"): StoredDocument(3, "x", 1),  # deleted
        str(tmp_path) + "-other/e.txt": StoredDocument(4, "x", 1),  # another folder's: left alone
    }
    assert [diff_file(f, stored, f.read()) for f in files] == [
        None, sha256_bytes(b"beta"), sha256_bytes(b"<p>gamma</p>")]
    assert deleted_paths(stored, tmp_path, {a, b, c}) == [str(tmp_path / "gone.txt")]


def test_is_under_needs_a_separator() -> None:
    root = Path("/data/docs")
    assert is_under("/data/docs/a.txt", root) and is_under("/data/docs/x/y.md", root)
    assert not is_under("/data/docs2/a.txt", root) and not is_under("/data/doc", root)
    assert deleted_paths(["/data/docs/a", "/data/docs2/b"], root, set()) == ["/data/docs/a"]


def test_links_out_of_the_folder_are_never_followed(tmp_path: Path) -> None:
    """A file link pointing outside the indexed folder used to be indexed, so anyone who could search
    the collection could read the file it pointed to."""
    root, outside = tmp_path / "docs", tmp_path / "system"
    root.mkdir()
    outside.mkdir()
    (outside / "passwd.txt").write_text("root:x:0:0")
    (outside / "dir").mkdir()
    (outside / "dir" / "inner.txt").write_text("secret")
    (root / "own.txt").write_text("mine")
    (root / "leak.txt").symlink_to(outside / "passwd.txt")
    (root / "alias.txt").symlink_to(root / "own.txt")  # a link that stays inside is fine
    (root / "linked_dir").symlink_to(outside / "dir", target_is_directory=True)
    (root / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    files = scan_folder(root)
    assert [f.path.name for f in files] == ["alias.txt", "own.txt"]
    assert files[1].read() == b"mine"
    (root / "own.txt").unlink()  # swapped for a link after the scan: the read refuses it
    (root / "own.txt").symlink_to(outside / "passwd.txt")
    with pytest.raises(PermissionError):
        files[1].read()
