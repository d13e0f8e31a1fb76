"""`homeai jobs add|list|show|pause|resume|rm`: background jobs of a running server, over HTTP.

    homeai jobs add index ~/Documents --collection docs [--schedule "0 3 * * *"]
    homeai jobs add prompt "Summarize: {new_documents}" --collection docs --class summarize --schedule "0 7 * * *"
    homeai jobs add retention --days 30 --schedule "every 1d"
    homeai jobs list · show ID · pause ID · resume ID · rm ID

``--url`` (default $HOMEAI_URL or http://127.0.0.1:8000) and ``--key`` (default $HOMEAI_API_KEY; an admin
key once keys exist) say which server.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


def add_jobs_commands(subparsers: Any) -> argparse.ArgumentParser:
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--url", default=os.environ.get("HOMEAI_URL", DEFAULT_URL),
                        help=f"the server (default: $HOMEAI_URL or {DEFAULT_URL})")
    server.add_argument("--key", default=os.environ.get("HOMEAI_API_KEY"), help="API key (default: $HOMEAI_API_KEY)")
    server.add_argument("--json", action="store_true", help="print the server's JSON")

    jobs = subparsers.add_parser("jobs", help="background jobs: indexing, scheduled prompts, retention")
    sub = jobs.add_subparsers(dest="jobs_command", required=True)
    add = sub.add_parser("add", parents=[server], help="create a job")
    add.add_argument("kind", choices=["index", "prompt", "retention"])
    add.add_argument("target", nargs="?", help="index: the folder (on the server); prompt: the prompt text")
    add.add_argument("--collection", help="index: the collection to fill; prompt: for {new_documents}")
    add.add_argument("--schedule", help="cron ('0 3 * * *'), interval ('every 6h') or ISO time; default: now")
    add.add_argument("--class", dest="class_name", help="prompt: the LLM class to run in")
    add.add_argument("--max-tokens", type=int, help="prompt: answer length limit")
    add.add_argument("--days", type=float, help="retention: keep this many days of the request log")
    add.set_defaults(func=cmd_add)
    sub.add_parser("list", parents=[server], help="list jobs").set_defaults(func=cmd_list)
    for name, func, text in (("show", cmd_show, "one job with progress and recent runs"),
                             ("pause", cmd_pause, "pause a job"), ("resume", cmd_resume, "resume a paused job"),
                             ("rm", cmd_rm, "delete a job")):
        p = sub.add_parser(name, parents=[server], help=text)
        p.add_argument("id", type=int)
        p.set_defaults(func=func)
    return jobs


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=30)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise SystemExit(f"error: cannot reach {args.url}: {e}") from None
    if response.status_code >= 400:
        try:
            error = response.json().get("error", {})
            message = error.get("message") if isinstance(error, dict) else str(error)
        except ValueError:
            message = response.text
        raise SystemExit(f"error: {response.status_code} {message or response.reason_phrase}")
    return response.json()


def _progress(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if job.get("kind") != "index" and not p.get("total_chunks"):
        return "-"
    text = f"{p.get('done_chunks', 0)}/{p.get('total_chunks', 0)} chunks"
    if job.get("state") == "running":
        eta = p.get("eta_s")
        text += f" {p.get('chunks_per_s', 0):.1f}/s" + (f" ETA {eta:.0f}s" if eta is not None else "")
    return text


def _target(job: dict[str, Any]) -> str:
    spec = job.get("spec") or {}
    if job.get("kind") == "index":
        return f"{spec.get('path')} -> {spec.get('collection')}"
    if job.get("kind") == "prompt":
        prompt = str(spec.get("prompt", "")).replace("\n", " ")
        return prompt[:40] + ("…" if len(prompt) > 40 else "")
    return f"older than {spec.get('days')} days"


def _print(args: argparse.Namespace, body: Any) -> None:
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(f"job {body['id']}: {body['kind']} {body['state']} · {_target(body)} · {_progress(body)}")


def cmd_add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind}
    if args.kind == "index":
        if not args.target:
            raise SystemExit("error: index needs a folder")
        folder = Path(args.target).expanduser()
        body["path"] = str(folder.resolve()) if folder.exists() else args.target
        body["collection"] = args.collection or folder.resolve().name
    elif args.kind == "prompt":
        if not args.target:
            raise SystemExit("error: prompt needs the prompt text")
        body["prompt"] = args.target
    for key, value in (("collection", args.collection), ("schedule", args.schedule), ("class", args.class_name),
                       ("max_tokens", args.max_tokens), ("days", args.days)):
        if value is not None:
            body[key] = value
    _print(args, _call(args, "POST", "/v1/jobs", body))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _call(args, "GET", "/v1/jobs")["jobs"]
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no jobs")
        return 0
    rows = [("ID", "KIND", "STATE", "SCHEDULE", "PROGRESS", "WHAT")]
    rows += [(str(j["id"]), j["kind"], j["state"], j.get("schedule") or "-", _progress(j), _target(j)) for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    job = _call(args, "GET", f"/v1/jobs/{args.id}")
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    _print(args, job)
    for key in ("schedule", "next_run_at", "error", "created_by", "created_at", "started_at", "finished_at"):
        if job.get(key):
            print(f"  {key}: {job[key]}")
    for run in job.get("runs", []):
        print(f"  run {run['id']} {run['state']} {run['started_at']}" + (f": {run['error']}" if run["error"] else ""))
        if run.get("output"):
            print("    " + run["output"].replace("\n", "\n    "))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    _print(args, _call(args, "POST", f"/v1/jobs/{args.id}/pause"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    _print(args, _call(args, "POST", f"/v1/jobs/{args.id}/resume"))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    _call(args, "DELETE", f"/v1/jobs/{args.id}")
    print(f"job {args.id} deleted")
    return 0
