"""Start failures and bad values of `homeai serve`, `homeai node join` and `homeai bench speed|quant` end with
one line (or argparse's usage error naming the flag), never a traceback; a failed start stops the Ray head it
started; a background compile of decode steps never aborts the process at its exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from litestar import Litestar

from homeai.api.app import engine_lifespan
from homeai.api.services import Services, app_state
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.cli import arg_types
from homeai.cli import main as cli_main
from homeai.cli.main import main
from homeai.cluster.ray_process import split_address
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder

TESTS_DIR = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`homeai serve` in a process of its own (a failed start leaves with os._exit); no model is pulled."""
    full_env = {**os.environ, "HOMEAI_CACHE_DIR": str(tmp_path / "cache"), **env}
    return subprocess.run([sys.executable, "-m", "homeai.cli.main", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data")], env=full_env, capture_output=True, text=True, timeout=120)


def assert_one_error_line(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and says in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_database_that_refuses_the_connection_is_one_line(tmp_path: Path) -> None:
    done = serve(tmp_path, HOMEAI_DATABASE_URL="postgresql+asyncpg://x:y@127.0.0.1:1/db")
    assert_one_error_line(done, "error: cannot open the database: ConnectionRefusedError")


def test_a_cluster_address_from_the_env_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    done = serve(tmp_path, HOMEAI_CLUSTER="127.0.0.1:abc")
    assert_one_error_line(done, "error: cannot start the cluster: ValueError: expected HOST[:PORT] with a port")


class FailingGateway:
    def start(self) -> None:
        raise RuntimeError("the model does not load")


async def test_a_failed_start_stops_the_ray_head_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[bool] = []

    def cluster_gateway(*_: Any) -> tuple[FailingGateway, Callable[[], None]]:
        return FailingGateway(), lambda: stopped.append(True)

    monkeypatch.setattr("homeai.cluster.front_door.cluster_gateway", cluster_gateway)
    services = Services(Settings(data_dir=tmp_path, cluster="127.0.0.1:6380"),
                        PolicyHolder(load_policy(DEFAULT_POLICY)))
    with pytest.raises(RuntimeError, match="does not load"):
        async with engine_lifespan(Litestar(route_handlers=[], state=app_state(services))):
            pass
    assert stopped == [True]  # left running, the next start attached to this orphan


@pytest.mark.parametrize("argv", [
    ["serve", "--cluster", "127.0.0.1:abc"], ["serve", "--cluster", "127.0.0.1:70000"], ["serve", "--cluster", ":1"],
    ["serve", "--drain-timeout", "inf"], ["serve", "--drain-timeout", "nan"], ["serve", "--drain-timeout", "-1"],
    ["bench", "speed", "--batch", "1,x"], ["bench", "speed", "--batch", "0"]])
def test_bad_values_are_usage_errors_naming_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"argument {next(a for a in argv if a.startswith('--'))}" in capsys.readouterr().err


def test_a_node_address_that_does_not_parse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["node", "join", "host:abc"])
    assert exit_.value.code == 2 and "argument address: expected HOST[:PORT]" in capsys.readouterr().err


def test_a_node_address_that_does_not_resolve_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CLUSTER_TOKEN", "t")
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"):  # use_token sets them
        monkeypatch.delenv(name, raising=False)
    assert main(["node", "join", "no-such-host.invalid:6380"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot find this machine's address towards no-such-host.invalid:6380")
    assert "\n" not in err


@pytest.mark.parametrize("argv", [["bench", "speed", "--model", "nope"], ["bench", "quant", "--model", "nope"]])
def test_a_bench_of_an_unknown_model_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "nope" in err and "\n" not in err


def test_the_new_types_take_what_they_should() -> None:
    assert arg_types.seconds("0") == 0.0 and arg_types.seconds("2.5") == 2.5
    assert arg_types.seed(str(2**63 - 1)) == 2**63 - 1 and arg_types.seed(str(-(2**63))) == -(2**63)
    assert arg_types.cluster_address("10.0.0.2") == "10.0.0.2"  # as given: the cluster reads the port
    assert arg_types.cluster_address("pc.lan:7000") == "pc.lan:7000"
    assert split_address("10.0.0.2:0") == ("10.0.0.2", 0)


def test_a_compile_a_command_left_running_ends_the_process_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`homeai serve` stopped during its first compile: the command returns, and the process leaves without
    waiting for (or finalising Python under) the bucket being compiled; a compile that ran before the
    command is not its own and changes nothing."""
    running: set[threading.Thread] = {threading.Thread()}
    fake_graph = SimpleNamespace(compile_threads=lambda: set(running))
    monkeypatch.setitem(sys.modules, "homeai.runtime.decode_graph", fake_graph)
    exits: list[int] = []
    monkeypatch.setattr(cli_main, "exit_now", exits.append)

    def command(_: Any) -> int:
        running.add(threading.Thread())
        return 0

    monkeypatch.setattr("homeai.cli.repository_cmds.cmd_models", lambda _: 0)
    assert main(["models"]) == 0 and exits == []
    monkeypatch.setattr("homeai.cli.repository_cmds.cmd_models", command)
    main(["models"])
    assert exits == [0]


EXIT_WHILE_COMPILING = textwrap.dedent("""
    import atexit, sys, time
    from pathlib import Path
    import torch
    from llama_helpers import random_llama_weights
    from homeai.runtime.decode_graph import CompiledDecode, compile_threads
    from homeai.runtime.kv_cache import KVCache
    from homeai.runtime.llama import LlamaModel
    from homeai.runtime.llama_config import LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True)
    model = LlamaModel(cfg, random_llama_weights(cfg, seed=7), torch.device("cpu"), torch.float32, "none")
    cache = KVCache(cfg.num_layers, 16, 4, cfg.num_kv_heads, cfg.head_dim, model.device, model.kv_dtype)
    compiled = CompiledDecode(model, cache, 64, max_batch=1, cache_dir=Path(sys.argv[1]), buckets=(1,))
    compiled.start()
    time.sleep(0.5)
    print("stopped in time:", compiled.stop(timeout=0.1), flush=True)
    atexit.register(lambda: print("compiling at exit:", bool(compile_threads()), flush=True))
""")


@pytest.mark.slow
def test_a_process_that_exits_while_a_bucket_compiles_waits_for_it(tmp_path: Path) -> None:
    """Not through the CLI (a library user, a test process): the bucket being compiled finishes before Python
    finalises, which tore the thread down inside Inductor's C++ code ("terminate called", exit 134). A fresh
    Inductor cache, so the compile still runs at exit (some 15 s on two cores)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", EXIT_WHILE_COMPILING, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped in time: False" in done.stdout and "compiling at exit: False" in done.stdout, done.stdout
