"""Ordinary mistakes on the command line are argparse's usage errors naming the flag (exit 2), never a
traceback from deep inside the command; an environment default that does not parse only stops the
command that uses it."""

from __future__ import annotations

import argparse

import pytest

from homeai.cli import arg_types
from homeai.cli.main import main


@pytest.mark.parametrize("argv", [
    ["serve", "--port", "99999"], ["serve", "--port", "-1"], ["serve", "--kv-cache-mb", "0"],
    ["serve", "--device", "cuda:99"], ["serve", "--device", "bogus"],  # cuda:99: none here, nor on a GPU box
    ["policy", "validate", "x.yaml", "--kv-cache-mb", "-5"],
    ["chat", "m", "--max-tokens", "0"], ["chat", "m", "--temperature", "-1"], ["chat", "m", "--top-p", "0"],
    ["bench", "kernels", "--rows", "a"]])
def test_bad_values_are_usage_errors_naming_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"argument {next(a for a in argv if a.startswith('--'))}" in capsys.readouterr().err


def test_a_port_from_the_environment_that_does_not_parse_stops_serve_only(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_PORT", "abc")
    assert main(["policy", "schema"]) == 0  # every command failed while the parser was built
    with pytest.raises(SystemExit):
        main(["serve"])
    assert "argument --port: expected a port, got 'abc'" in capsys.readouterr().err


def test_the_types_take_what_they_should() -> None:
    assert arg_types.port("8000") == 8000 and arg_types.positive_int("256") == 256
    assert arg_types.positive_ints("4,1,2,2") == [1, 2, 4] and arg_types.device("cpu") == "cpu"
    assert arg_types.non_negative_float("0") == 0.0 and arg_types.probability("1") == 1.0
    with pytest.raises(argparse.ArgumentTypeError):
        arg_types.non_negative_float("inf")
