"""The import graph (issue 27, item 5): every public module can be imported first, and no
module-level import circle runs through the config (benchmarks/import_graph.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_graph",
                                              ROOT / "benchmarks" / "import_graph.py")
ig = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ig)

#: modules a user or a plugin may import before any other (ddlsim.configload failed with a
#: circular ImportError when imported first)
FIRST = ("ddlsim.configload", "ddlsim.config", "ddlsim.registered", "ddlsim.workloads.registry",
         "ddlsim.stackrules", "ddlsim.api")


@pytest.mark.parametrize("module", FIRST)
def test_module_imports_first(module):
    code = f"import {module}; from ddlsim.config import load_config, validate_model, RunConfig"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_no_circle_through_the_config():
    graph = ig.import_graph()
    config = [m for m in graph if m.startswith(("ddlsim.config", "ddlsim.registered"))]
    assert config, "the graph has no config modules: the reader lost them"
    assert [c for c in ig.circles(graph) if set(c) & set(config)] == []


def test_the_config_imports_no_workload_at_module_level():
    graph = ig.import_graph()
    assert sorted(m for m in graph.successors("ddlsim.config")
                  if m.startswith("ddlsim.workloads")) == []


def test_the_reader_sees_a_circle_and_skips_deferred_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "ddlsim"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "a.py").write_text("from .sub.b import x\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import c\n"
        "from ..a import y\n\ndef f():\n    from .. import c\n")
    (pkg / "c.py").write_text('PLUGINS = ("ddlsim.a",)  # loaded by name\n')
    graph = ig.import_graph(pkg)
    assert ig.circles(graph) == [["ddlsim.a", "ddlsim.sub", "ddlsim.sub.b"]]
    assert not graph.has_edge("ddlsim.sub.b", "ddlsim.c")
    assert ig.import_graph(pkg, deferred=True).has_edge("ddlsim.sub.b", "ddlsim.c")
    assert not graph.has_edge("ddlsim.c", "ddlsim.a")       # a load by name is listed apart
    assert ig.loads_by_name(pkg) == [("ddlsim.c", 1, "ddlsim.a")]
