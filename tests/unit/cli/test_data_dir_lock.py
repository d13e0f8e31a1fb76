"""One server per data directory: a second `homeai serve` on the same one says who holds it and stops before
loading anything. Two ran the job scheduler on one job table, and each start re-ran the other's live runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from homeai.cli.data_dir_lock import DataDirTakenError, hold_data_dir


def test_a_data_dir_is_held_by_one_process_and_free_once_it_ends(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fd = hold_data_dir(data)
    try:
        assert oct(data.stat().st_mode & 0o777) == "0o700"
        with pytest.raises(DataDirTakenError, match=f"pid {os.getpid()}"):
            hold_data_dir(data)
        other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                                "from homeai.cli.data_dir_lock import hold_data_dir; hold_data_dir(Path(sys.argv[1]))",
                                str(data)], capture_output=True, text=True)
        assert other.returncode != 0 and "another homeai server" in other.stderr
    finally:
        os.close(fd)
    os.close(hold_data_dir(data))  # released: taken again


def test_serve_refuses_a_data_dir_another_server_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fd = hold_data_dir(data)
    try:
        run = subprocess.run([sys.executable, "-m", "homeai.cli.main", "serve", "--data-dir", str(data),
                              "--port", "0"], capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    assert run.returncode == 1
    assert run.stdout.strip() == (f"error: another homeai server (pid {os.getpid()}) uses the data dir {data}; "
                                  "stop it or give this one --data-dir")
