"""`homeai chat` ends as a user expects: exit 0 after its answer (not an abort after a 10 s hang, while a
background compile of decode steps was torn down), one `error:` line for a prompt the engine refuses or an
answer that fails, and an interactive conversation that goes on past such a message and past its context."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from homeai.cli.chat_cmd import reply
from homeai.cli.main import main
from homeai.core.types import FinishReason, SamplingParams, TokenDelta

LLM = "smollm2-135m-instruct"
TOO_LONG = "hello " * 3000  # some 3,000 tokens: more than the 2,048 the model is served with
LONG = "hello " * 700  # three of these with their answers outgrow the context


CHAT_THEN_LOOK = """
import atexit, sys, threading
from homeai.cli.main import main
atexit.register(lambda: print("compiling at exit:", any(t.name == "homeai-compile" for t in threading.enumerate())))
sys.exit(main(sys.argv[1:]))
"""


def test_a_one_shot_chat_exits_0(pulled_models: dict[str, Path], homeai_cache_dir: Path, tmp_path: Path) -> None:
    """With the engine's default compile mode (auto: compile wherever torch.compile works) and a cold Inductor
    cache: the answer came, then a 10 s wait for the compile thread, then an abort as Python finalised under it
    (exit 134; exit 0 at times, the thread killed where it stood). A chat compiles nothing."""
    env = {k: v for k, v in os.environ.items() if k != "HOMEAI_COMPILE_DECODE"}
    env.update(HOMEAI_CACHE_DIR=str(homeai_cache_dir), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, "-c", CHAT_THEN_LOOK, "chat", LLM, "--device", "cpu", "-p", "hi",
                           "--max-tokens", "4"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answer, _, looked = done.stdout.strip().rpartition("\n")
    assert answer.strip() and looked == "compiling at exit: False", done.stdout


def test_a_prompt_longer_than_the_context_is_one_line(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))
    assert main(["chat", LLM, "--device", "cpu", "-p", TOO_LONG, "--max-tokens", "4"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: prompt has") and "\n" not in err


def test_an_interactive_chat_goes_on_past_a_refused_message_and_its_context(
        pulled_models: dict[str, Path], homeai_cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join([TOO_LONG, LONG, LONG, LONG, "say hi", ""])))
    assert main(["chat", LLM, "--device", "cpu", "--max-tokens", "4", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("error: prompt has") == 1 and "Traceback" not in err
    assert "(dropped the oldest exchange: the context holds 2048 tokens)" in err


class FakeTokenizer:
    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        return [1, 2, 3]


class FailingEngine:
    """An engine whose answer ends with an error after some text (a step that failed twice)."""

    tokenizer = FakeTokenizer()
    max_model_len = 2048

    async def generate(self, ids: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta]:
        yield TokenDelta("r", "Hel", [7], len(ids), 1)
        yield TokenDelta("r", "", [], len(ids), 1, finish_reason=FinishReason.ABORT,
                         error="engine error: ValueError: boom")


def test_an_answer_that_ends_with_an_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert reply(FailingEngine(), [{"role": "user", "content": "hi"}], SamplingParams()) is None
    out, err = capsys.readouterr()
    assert out == "Hel\n" and err == "error: engine error: ValueError: boom\n"


@pytest.mark.parametrize("seed", ["99999999999999999999", str(-(2**63) - 1), "x"])
def test_a_seed_torch_cannot_take_is_a_usage_error(seed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["chat", LLM, "--seed", seed])
    assert exit_.value.code == 2 and "argument --seed" in capsys.readouterr().err
