"""deploy/: the systemd units, the Containerfile and compose.yaml run `homeai ...` command lines that the real
CLI parses, with the values their example environment files give; the node unit keeps the gateway unit's
service settings; only the HTTP port is published; the image pins torch as pyproject.toml does.

Parts of issue 23's CLI (`homeai node join`, `homeai serve --cluster`) may not exist yet: a command line
that needs a missing part is skipped, naming it, and checked as soon as the CLI has it.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from homeai.cli import main as cli_main

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
REPO = DEPLOY.parent
GATEWAY_UNIT, NODE_UNIT = DEPLOY / "homeai.service", DEPLOY / "homeai-node.service"
Unit = dict[str, dict[str, list[str]]]


# ---- reading the files ------------------------------------------------------------------------------
def read_unit(path: Path) -> Unit:
    """section -> key -> every value it is given (systemd allows a key more than once)."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}: keep each setting on one line: {line}"
        if line.startswith("["):
            section = unit.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a KEY=VALUE line: {line}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def read_env(path: Path) -> dict[str, str]:
    """An EnvironmentFile / env_file: KEY=VALUE lines, # comments."""
    env: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip("\"'")
    return env


def exec_argv(command: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion of an ExecStart line: a word that is only ``$VAR`` becomes VAR's value split at
    whitespace (no word at all when unset or empty); ``${VAR}`` is replaced inside its word."""
    argv: list[str] = []
    for word in shlex.split(command):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv.extend(env.get(whole[1], "").split())
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m[1], ""), word))
    return argv


def unit_argv(unit_path: Path, env_path: Path | None) -> list[str]:
    """The `homeai` arguments a unit runs (the executable dropped), under ``env_path``'s values."""
    service = read_unit(unit_path)["Service"]
    env = dict(v.split("=", 1) for v in service.get("Environment", []))
    env.update(read_env(env_path) if env_path else {})
    (command,) = service["ExecStart"]
    argv = exec_argv(command, env)
    assert Path(argv[0]).name == "homeai", argv
    return argv[1:]


# ---- the real CLI parser -------------------------------------------------------------------------------
class _Built(Exception):
    pass


def real_parser() -> argparse.ArgumentParser:
    """The parser `homeai` runs: ``build_parser()`` where main.py has one, else the one ``main()`` builds,
    caught at its ``parse_args`` (so no command runs)."""
    build = getattr(cli_main, "build_parser", None)
    if callable(build):
        parser = build()
        assert isinstance(parser, argparse.ArgumentParser)
        return parser
    built: list[argparse.ArgumentParser] = []

    class Catching(argparse.ArgumentParser):
        def parse_args(self, *args: Any, **kwargs: Any) -> Any:
            built.append(self)
            raise _Built

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_main, "argparse", SimpleNamespace(ArgumentParser=Catching))
        with pytest.raises(_Built):
            cli_main.main([])
    return built[0]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """``argv`` through the real parser; skipped while the part of the CLI it needs is missing."""
    parser = real_parser()
    commands = subcommands(parser)
    if argv[0] not in commands:
        pytest.skip(f"`homeai {argv[0]}` is not in the CLI yet (issue 23 adds it)")
    if argv[0] == "node" and argv[1] not in subcommands(commands["node"]):
        pytest.skip(f"`homeai node {argv[1]}` is not in the CLI yet (issue 23 adds it)")
    if argv[0] == "serve" and "--cluster" in argv and "--cluster" not in commands["serve"]._option_string_actions:
        pytest.skip("`homeai serve --cluster` is not in the CLI yet (issue 23 adds it)")
    try:
        return plain_parse(parser, argv)
    except SystemExit:
        pytest.fail(f"the CLI refuses: homeai {shlex.join(argv)}")


def plain_parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parse_args`` of argparse itself (the caught parser's own override only records it)."""
    return argparse.ArgumentParser.parse_args(parser, argv)


# ---- systemd units -----------------------------------------------------------------------------------
def test_gateway_unit_without_its_env_file_serves_a_single_box() -> None:
    args = parse_cli(unit_argv(GATEWAY_UNIT, None))
    assert args.command == "serve" and args.host == "127.0.0.1" and args.port == 8000
    assert getattr(args, "cluster", None) is None


def test_gateway_unit_with_the_example_env_is_a_front_door() -> None:
    args = parse_cli(unit_argv(GATEWAY_UNIT, DEPLOY / "gateway.env.example"))
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert args.cluster == "192.168.1.10"


def test_node_unit_joins_with_the_example_env() -> None:
    argv = unit_argv(NODE_UNIT, DEPLOY / "node.env.example")
    assert argv[:3] == ["node", "join", "192.168.1.10:6380"], argv
    args = parse_cli(argv)
    values = vars(args).values()
    assert "192.168.1.10:6380" in values and "cuda:0" in values and "den-pc" in values, vars(args)
    assert "smollm2-135m-instruct" in str(args.models)


def test_node_unit_keeps_the_gateway_units_service_settings() -> None:
    gateway, node = read_unit(GATEWAY_UNIT), read_unit(NODE_UNIT)
    same = ("User", "WorkingDirectory", "KillSignal", "KillMode", "TimeoutStopSec", "SuccessExitStatus",
            "Restart", "RestartSec", "StateDirectory", "StateDirectoryMode", "UMask", "CacheDirectory")
    for key in same:
        assert node["Service"].get(key) == gateway["Service"].get(key), key
    assert node["Service"]["Restart"] == ["on-failure"]
    assert node["Service"].get("Type", ["simple"]) == ["simple"]  # `node join` stays in the foreground
    assert {"HOMEAI_DATA_DIR=/var/lib/homeai", "HOMEAI_CACHE_DIR=/var/cache/homeai"} <= set(
        node["Service"]["Environment"])
    for section in ("Unit", "Install"):
        assert {k: v for k, v in node[section].items() if k != "Description"} == {
            k: v for k, v in gateway[section].items() if k != "Description"}, section
    (gateway_env,), (node_env,) = gateway["Service"]["EnvironmentFile"], node["Service"]["EnvironmentFile"]
    assert gateway_env.startswith("-"), "the gateway runs without a cluster file"
    assert not node_env.startswith("-"), "a node cannot run without its address and token"
    assert {"HOMEAI_CLUSTER_ADDRESS", "HOMEAI_CLUSTER_TOKEN"} <= read_env(DEPLOY / "node.env.example").keys()


def test_the_gateways_data_is_its_service_users_alone() -> None:
    """Before: /var/lib/homeai was 0755 and homeai.db 0644, so any account on the box read every indexed
    chunk and the request log past the collections' readers."""
    service = read_unit(GATEWAY_UNIT)["Service"]
    assert service["StateDirectoryMode"] == ["0700"] and service["UMask"] == ["0077"]


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not on this machine")
    for unit in (GATEWAY_UNIT, NODE_UNIT):  # the executable must exist where verify runs
        text = unit.read_text(encoding="utf-8").replace("/opt/homeai/.venv/bin/homeai", sys.executable)
        (tmp_path / unit.name).write_text(text, encoding="utf-8")
    files = [str(tmp_path / u.name) for u in (GATEWAY_UNIT, NODE_UNIT)]
    done = subprocess.run([analyze, "verify", "--man=no", *files], capture_output=True, text=True, timeout=60)
    ours = [line for line in done.stderr.splitlines() if str(tmp_path) in line or ".service:" in line]
    assert done.returncode == 0 and not ours, done.stderr


# ---- the image and compose ----------------------------------------------------------------------------
def containerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def instruction(name: str) -> list[str]:
    return [i.split(None, 1)[1] for i in containerfile() if i.split(None, 1)[0] == name]


def test_containerfile_installs_the_cluster_extra_and_pyprojects_torch() -> None:
    assert instruction("FROM") == ["python:3.11-slim"]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (torch_pin,) = [d for d in deps if re.match(r"torch\b", d)]
    assert f"TORCH_VERSION={torch_pin.removeprefix('torch==')}" in instruction("ARG"), torch_pin
    runs = instruction("RUN")
    assert any('"torch==${TORCH_VERSION}"' in r for r in runs)
    assert any("pip install" in r and "'.[cluster]'" in r for r in runs), runs
    assert "HOMEAI_MODELS=" in instruction("ARG")  # no model is pulled unless the build arg names one
    for copy in instruction("COPY"):
        *sources, _ = [part for part in copy.split() if not part.startswith("--")]
        assert all((REPO / s).exists() for s in sources), copy
    assert "--chown=homeai:homeai models models" in instruction("COPY")  # `homeai pull FILE.gguf` writes there
    entry = json.loads(instruction("ENTRYPOINT")[0])
    assert entry == ["homeai"]
    assert parse_cli(json.loads(instruction("CMD")[0])).command == "serve"


def test_pyproject_has_the_cluster_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"].get(
        "optional-dependencies", {})
    if "cluster" not in extras:
        pytest.skip("pyproject.toml has no `cluster` extra yet (issue 23 adds it); the image installs it")
    assert any(re.match(r"ray\b", d) for d in extras["cluster"]), extras["cluster"]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_compose_runs_a_front_door_and_a_node_the_cli_parses() -> None:
    services = compose()["services"]
    assert set(services) == {"gateway", "node"}
    gateway = parse_cli(services["gateway"]["command"])
    assert gateway.command == "serve" and gateway.host == "0.0.0.0"
    fixed_ip = services["gateway"]["networks"]["cluster"]["ipv4_address"]
    assert gateway.cluster == fixed_ip  # the head binds an address the node reaches
    subnet = compose()["networks"]["cluster"]["ipam"]["config"][0]["subnet"]
    assert ipaddress.ip_address(fixed_ip) in ipaddress.ip_network(subnet)
    node_argv = services["node"]["command"]
    assert node_argv[:3] == ["node", "join", "gateway:6380"]
    parse_cli(node_argv)
    assert "gateway" in services["node"]["depends_on"]


def test_compose_publishes_only_http_and_shares_the_token() -> None:
    services = compose()["services"]
    assert "ports" not in services["node"]
    (published,) = services["gateway"]["ports"]
    assert str(published).split(":")[-1] == "8000", "only the gateway's HTTP port"
    assert not any("expose" in s or "network_mode" in s for s in services.values())
    env_files = {str(s["env_file"]) for s in services.values()}
    assert env_files == {"cluster.env"}  # one token for both
    assert "HOMEAI_CLUSTER_TOKEN" in read_env(DEPLOY / "cluster.env.example")
    for service in services.values():
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Containerfile"}
