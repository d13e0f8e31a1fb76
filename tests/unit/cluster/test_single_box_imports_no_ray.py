"""Without a cluster nothing changes: the server, its app and the CLI never import Ray."""

from __future__ import annotations

import subprocess
import sys


def test_the_single_box_server_does_not_import_ray() -> None:
    code = ("import sys; import homeai.cli.main, homeai.api.app, homeai.gateway.gateway, homeai.cluster.router; "
            "from homeai.cli.main import main; "
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
