"""A setting ``homeai serve`` cannot use ends the start with one line naming it, not a traceback (under
systemd's Restart=on-failure a traceback filled the journal every few seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.cli.main import main


@pytest.mark.parametrize(("env", "value", "says"), [
    ("HOMEAI_DRAIN_TIMEOUT_S", "30s", "HOMEAI_DRAIN_TIMEOUT_S must be a number of seconds, got '30s'"),
    ("HOMEAI_DRAIN_TIMEOUT_S", "inf", "must be a finite number of seconds, at least 0"),
    ("HOMEAI_DRAIN_TIMEOUT_S", "-5", "must be a finite number of seconds, at least 0"),
    ("HOMEAI_DATABASE_URL", "postgres://x", "is not a database URL SQLAlchemy knows"),
    ("HOMEAI_DATABASE_URL", "postgresql://u@h/db", "needs an async driver"),
])
def test_a_bad_setting_is_one_line(env: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv(env, value)
    assert main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and says in out and "\n" not in out


def test_a_data_dir_that_cannot_be_made_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["serve", "--port", "0", "--data-dir", str(blocker / "data")]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: cannot prepare the data dir") and "\n" not in out
