"""A prompt job's ``{new_documents}``: the paths committed since its last successful run, or since the job
was made, at most a bounded share of the prompt. Every path of the collection went in before a first
success: thousands of them made a prompt longer than the model's context, the run failed, the next had the
same list, and the job never succeeded."""

from __future__ import annotations

import numpy as np

from homeai.jobs.kinds import NEW_DOCUMENTS_CHARS, expand_prompt
from homeai.store.collections import NewChunk
from homeai.store.db import Store


async def test_new_documents_are_those_since_the_job_was_made_and_the_list_is_bounded(store: Store) -> None:
    cid = await store.collections.ensure("notes")
    vector = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    await store.collections.commit_document(cid, "/notes/before.txt", "s", 0.0, [NewChunk("old", 1, vector)])
    job = await store.jobs.create("prompt", {"prompt": "Summarize what is new:\n{new_documents}",
                                             "collection": "notes"}, "0 7 * * *", "test")
    assert "(no new documents)" in await expand_prompt(job, store.jobs, store.collections)
    for i in range(400):
        await store.collections.commit_document(cid, f"/notes/2026/december/meeting-{i:05d}.txt", "s", 0.0,
                                                [NewChunk("new", 1, vector)])
    prompt = await expand_prompt(job, store.jobs, store.collections)
    assert "before.txt" not in prompt and "/notes/2026/december/meeting-00000.txt" in prompt
    assert len(prompt) < NEW_DOCUMENTS_CHARS + 200 and prompt.rstrip().endswith("more)")
    listed = prompt.count("meeting-")
    assert f"(and {400 - listed} more)" in prompt
