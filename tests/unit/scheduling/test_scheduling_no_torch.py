"""DESIGN: policy and scheduling never import torch (the planner runs without the model runtime)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import homeai.policy, homeai.scheduling
for pkg in (homeai.policy, homeai.scheduling):
    for mod in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(mod.name)
print("torch" in sys.modules)
"""


def test_policy_and_scheduling_modules_do_not_import_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
