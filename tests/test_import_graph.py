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


def test_an_empty_package_is_no_edge_of_the_modules_below_it(tmp_path):
    """Importing ``pkg.empty.mod`` runs nothing of ``pkg.empty`` (its ``__init__`` is a
    docstring), so the importer depends on ``mod`` alone; a package that runs code is an edge."""
    pkg = tmp_path / "ddlsim"
    (pkg / "empty").mkdir(parents=True)
    (pkg / "busy").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "empty" / "__init__.py").write_text('"""a docstring only"""\n')
    (pkg / "empty" / "mod.py").write_text("X = 1\n")
    (pkg / "busy" / "__init__.py").write_text('"""runs code"""\nfrom . import mod\n')
    (pkg / "busy" / "mod.py").write_text("Y = 1\n")
    (pkg / "a.py").write_text("from .empty.mod import X\nfrom .busy.mod import Y\n")
    graph = ig.import_graph(pkg)
    assert graph.has_edge("ddlsim.a", "ddlsim.empty.mod")
    assert not graph.has_edge("ddlsim.a", "ddlsim.empty")
    assert graph.has_edge("ddlsim.a", "ddlsim.busy")


def test_the_workloads_reach_the_kernel_model_not_the_engines():
    """The kernel model (``ddlsim.simulator.kernels``) is a layer below the workloads that
    describe their ops with it; at module level a workload imports nothing else of
    ``ddlsim.simulator`` but the flex dispatcher's traffic model (``moe_dispatch``: DeepEP's
    traffic is the collective's)."""
    graph = ig.import_graph()
    reached = sorted((a, b) for a, b in graph.edges
                     if a.startswith("ddlsim.workloads.") and b.startswith("ddlsim.simulator")
                     and not b.startswith("ddlsim.simulator.kernels"))
    assert reached == [("ddlsim.workloads.decoder.moe_dispatch", "ddlsim.simulator.collectives"),
                       ("ddlsim.workloads.decoder.moe_dispatch",
                        "ddlsim.simulator.collectives.flex")]
    kernels = ig.layer("ddlsim.simulator.kernels.gemm")
    assert ig.layer("ddlsim.workloads.trace") < kernels < ig.layer("ddlsim.workloads.decoder")
    assert ig.upward(graph) == [(a, b, line) for a, b, line in ig.upward(graph)
                                if a == "ddlsim.workloads.decoder.moe_dispatch"]
