"""The non-indexing job kinds: a prompt run in a chosen class (its answer is the run's output), and
retention of the request log. Both go through the same gateway and store as everything else.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from homeai.core.types import SamplingParams
from homeai.engine.errors import REPLICA_LOST
from homeai.scheduling.class_queue import QueueFullError
from homeai.store.collections import Collections
from homeai.store.jobs import JobInfo, Jobs
from homeai.store.request_log import prune_request_log

PROMPT_USER = "jobs"  # not in the policy: the default user's share and classes
NEW_DOCUMENTS = "{new_documents}"
NEW_DOCUMENTS_CHARS = 4000  # the list's share of a digest's prompt (~1,000 tokens), whatever the collection holds
MAX_QUEUE_RETRIES = 60
MAX_LOST_REPLICAS = 3  # a prompt job asks again this often when its node leaves mid-answer


async def expand_prompt(job: JobInfo, jobs: Jobs, collections: Collections) -> str:
    """``{new_documents}`` in the prompt becomes the paths committed to the job's collection since its
    last successful run, or since the job was made (a morning digest), at most NEW_DOCUMENTS_CHARS of them.
    Every path of the collection went in before a first success: a collection of thousands made a prompt
    longer than the model's context, the run failed, the next had the same list, and the job never
    succeeded again."""
    prompt = str(job.spec["prompt"])
    name = job.spec.get("collection")
    if NEW_DOCUMENTS not in prompt or not name:
        return prompt
    cid = await collections.find(str(name))
    last = await jobs.last_finished_run(job.id)
    paths = await collections.documents_since(cid, last.started_at if last else job.created_at) if cid else []
    return prompt.replace(NEW_DOCUMENTS, path_listing(paths))


def path_listing(paths: list[str], max_chars: int = NEW_DOCUMENTS_CHARS) -> str:
    """The paths one per line, as many as ``max_chars`` holds (at least one), then how many more there are."""
    if not paths:
        return "(no new documents)"
    lines: list[str] = []
    used = 0
    for path in paths:
        if lines and used + len(path) + 1 > max_chars:
            break
        lines.append(path)
        used += len(path) + 1
    more = len(paths) - len(lines)
    return "\n".join(lines) + (f"\n(and {more} more)" if more else "")


async def run_prompt(gateway: Any, job: JobInfo, prompt: str) -> str:
    """The model's answer to ``prompt`` as the chat template frames a user message."""
    spec = job.spec
    user = str(spec.get("user") or PROMPT_USER)
    route = gateway.route(spec.get("model"), spec.get("class"), "llm", user)
    await gateway.ensure_llm(route.model, None, route.class_name)  # an on-demand model may have left: load it
    ids = await asyncio.to_thread(gateway.chat_prompt, route.model, [{"role": "user", "content": prompt}])
    params = SamplingParams(temperature=float(spec.get("temperature", 0.0)),
                            max_tokens=int(spec.get("max_tokens") or 256))
    lost = 0
    for _ in range(MAX_QUEUE_RETRIES):
        try:
            return await _collect(gateway.generate(route, ids, params, user, f"job{job.id}-{uuid.uuid4().hex}",
                                                  kind="chat"))
        except QueueFullError as e:
            await asyncio.sleep(max(0.5, e.retry_after_s))
        except ReplicaLostError:  # its node left mid-answer: the job asks again (another replica answers)
            lost += 1
            if lost > MAX_LOST_REPLICAS:
                raise
    raise RuntimeError(f"class {route.class_name!r} stayed full")


class ReplicaLostError(RuntimeError):
    """The node serving the job's request left mid-answer (a cluster)."""


async def _collect(stream: Any) -> str:
    parts: list[str] = []
    async for delta in stream:
        if delta.error:
            raise (ReplicaLostError if delta.error.startswith(REPLICA_LOST) else RuntimeError)(delta.error)
        parts.append(delta.text)
    return "".join(parts)


async def run_retention(sessions: Any, job: JobInfo) -> str:
    days = float(job.spec.get("days", 30))
    removed = await prune_request_log(sessions, days)
    return f"deleted {removed} request-log rows older than {days:g} days"
