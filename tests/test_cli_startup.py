"""The CLI starts fast: importing it loads none of the heavy libraries a command may need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "scipy", "networkx", "matplotlib", "pydantic", "simpy")


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def test_importing_the_cli_loads_no_heavy_library():
    loaded = json.loads(_python(
        "import sys, json, ddlsim.cli; print(json.dumps(sorted(sys.modules)))"))
    assert [m for m in HEAVY if m in loaded] == []


def test_package_names_resolve_on_first_use():
    out = _python("import sys, ddlsim; a = 'pydantic' in sys.modules; ddlsim.load_config; "
                  "print(a, 'pydantic' in sys.modules, ddlsim.results_frame.__module__)")
    assert out.split() == ["False", "True", "ddlsim.simulator.result"]


def test_python_dash_m_ddlsim_is_the_command():
    """Where pip put the script off the PATH (``pip install --user``), ``python -m ddlsim``
    runs the same command, its errors one paragraph too."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "ddlsim", "--version"], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("ddlsim ")
    bad = subprocess.run([sys.executable, "-m", "ddlsim", "predikt"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
