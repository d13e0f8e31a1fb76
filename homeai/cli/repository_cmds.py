"""`homeai pull NAME` and `homeai models`: fetch weights once, and see what the repository serves."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from homeai.repository.cache import default_cache_dir
from homeai.repository.entries import EntryError, get_entry, load_entries
from homeai.repository.pull import PullError, pull


def add_repository_commands(subparsers: Any) -> None:
    """Register ``pull`` and ``models``; each sets ``func(args) -> int`` (the exit status)."""
    pull_parser = subparsers.add_parser("pull", help="download, verify and convert a model of the repository")
    pull_parser.add_argument("name", help="a model of `homeai models`, or a source to add: a .gguf file, a "
                             "Hugging Face folder, ollama:NAME[:TAG], hf:REPO[@REVISION]")
    pull_parser.add_argument("--force", action="store_true", help="pull again even if already present")
    pull_parser.add_argument("--as", dest="as_name", help="with a source: the new entry's name")
    pull_parser.add_argument("--quantization", choices=["auto", "none", "int8", "int4"], default="auto",
                             help="with a source: the new entry's weight format")
    pull_parser.set_defaults(func=cmd_pull)

    models = subparsers.add_parser("models", help="list the model repository and what is pulled")
    models.set_defaults(func=cmd_models)


def cmd_pull(args: argparse.Namespace) -> int:
    """Pull one model into the cache; exit 1 with the reason on any error."""
    from homeai.repository.sources import entry_for, entry_path, is_source_spec, write_entry

    started_s = time.perf_counter()
    written: Path | None = None
    try:
        if is_source_spec(args.name):
            entry = entry_for(args.name, getattr(args, "as_name", None), getattr(args, "quantization", "auto"))
            existed = entry_path(entry.name).exists()
            written = write_entry(entry)
            print(f"{entry.name}: entry written to {written}")
            written = None if existed else written
        else:
            entry = get_entry(args.name)
        path = pull(entry, default_cache_dir(), progress=True, force=args.force)
    except (EntryError, PullError, OSError) as exc:
        if written is not None:  # a new entry whose pull failed is not left behind (nothing would serve it)
            written.unlink(missing_ok=True)
            print(f"{entry.name}: entry {written} removed", file=sys.stderr)
        why = f"cannot write {exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else exc
        print(f"error: {why}", file=sys.stderr)
        return 1
    print(f"{entry.name}: ready at {path} ({time.perf_counter() - started_s:.1f} s)")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """Print one row per repository entry: served/native context, dtype, and whether it is pulled."""
    try:
        entries = load_entries()
    except EntryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from homeai.runtime.device import choose_device
    from homeai.runtime.weights_format import choose_weights_format

    cache_dir = default_cache_dir()
    device = choose_device(None)
    header = ("NAME", "KIND", "CONTEXT", "DTYPE", "WEIGHTS", "PRESENT", "PATH")
    rows = [header]
    reasons: list[str] = []
    for entry in entries.values():
        context = f"{entry.served_len}/{entry.context_length}"
        present = entry.is_present(cache_dir)
        weights = "-"
        if entry.kind == "llm":  # what a server started now would serve, and why (see weights_format)
            fmt = choose_weights_format(entry.quantization, entry.local_path(cache_dir), device) if present \
                else None
            weights = fmt.quantization if fmt is not None else entry.quantization
            if fmt is not None:
                reasons.append(f"{entry.name}: weights {fmt.quantization} on {device.type} ({fmt.reason})")
        rows.append((entry.name, entry.kind, context, entry.dtype, weights, "yes" if present else "no",
                     str(entry.local_path(cache_dir))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
            + "  "
            + row[-1]
        )
    for line in reasons:
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m homeai.cli.repository_cmds``) for use before the main CLI."""
    parser = argparse.ArgumentParser(prog="homeai")
    add_repository_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
