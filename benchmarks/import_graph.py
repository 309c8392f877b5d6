"""The import graph of the ddlsim package: its circles and the imports that run upward.

    python benchmarks/import_graph.py             # the figures, each circle, each upward import
    python benchmarks/import_graph.py --quiet     # the figures only
    python benchmarks/import_graph.py --deferred  # the same, counting imports inside functions

The graph has one node per module of ``ddlsim/`` and one edge per module-level import, read
from the source with :mod:`ast` (nothing is imported): the statements a module runs when it
is first imported, including those under ``if``/``try``/``with`` and in class bodies, but not
those inside functions (run on first use) or under ``if TYPE_CHECKING:`` (never run).
``from pkg import name`` imports ``pkg`` and, when ``name`` is a submodule, ``pkg.name``;
every import also runs the ``__init__`` of each package above the target that is not already
above the importing module (those are being imported already), and so adds an edge to it.

With ``--deferred`` the imports inside functions count too (those made on first use to keep
start-up fast or to step around a circle): the graph of what depends on what, whatever the
order of loading. A circle there is a design circle even when every import succeeds.

Loads by name are not imports here: a string naming a module, resolved on use by
``importlib.import_module`` (the lists of built-in plugins a registry loads, such as
``BUILTIN_FAMILIES``) or by a lazy re-export table (``ddlsim._lazy.lazy_exports``). They are
counted and listed apart, so that a circle broken by turning an import into a name shows.

* **Circles**: the strongly connected components of more than one module
  (:func:`networkx.strongly_connected_components`). In a circle, which module can be imported
  first depends on which one was; ``from a import b`` then fails with "partially initialized
  module" when the circle is entered at the wrong module.
* **Upward imports**: edges from a module of a lower layer to one of a higher layer, by the
  order :data:`LAYERS` declares (docs/extending.md, "Layers"). Each module belongs to the
  layer of the longest prefix of its name listed there. A package whose ``__init__`` is only
  its docstring runs nothing when a module below it is imported, so it is no edge then
  (:func:`empty_packages`); imported itself, it is one.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "ddlsim"

#: The layers, lowest first: a module may import from its own layer and the layers below.
#: The data flow config → trace → engine → result → report, under the front ends that drive
#: it. A name is a module or package prefix; the longest match decides.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("ddlsim._version", "ddlsim._lazy", "ddlsim.errors", "ddlsim.units",
                    "ddlsim.textio", "ddlsim.figio", "ddlsim.documents", "ddlsim.limits",
                    "ddlsim.formatting", "ddlsim.data", "ddlsim.workcount", "ddlsim.gcpause",
                    "ddlsim.hostmemory")),
    ("registries", ("ddlsim.registered", "ddlsim.workloads.registry")),
    ("config", ("ddlsim.config_types", "ddlsim.config_moe", "ddlsim.config_parallel",
                "ddlsim.software_fields",
                "ddlsim.software", "ddlsim.software_zero3",
                "ddlsim.config_system", "ddlsim.config", "ddlsim.configpresets",
                "ddlsim.configerrors", "ddlsim.configload", "ddlsim.presets", "ddlsim.stackrules",
                "ddlsim.fieldcheck")),
    ("topologies", ("ddlsim.topologies",)),
    ("trace", ("ddlsim.workloads.trace", "ddlsim.workloads.payloads", "ddlsim.workloads.steps")),
    ("kernels", ("ddlsim.simulator.kernels",)),
    ("workloads", ("ddlsim.workloads", "ddlsim.traces")),
    ("engines", ("ddlsim.simulator",)),
    ("results", ("ddlsim.planinfo", "ddlsim.api", "ddlsim.distributed")),
    ("tools", ("ddlsim.calibration", "ddlsim.reference", "ddlsim.search",
               "ddlsim.importers", "ddlsim.sweeps", "ddlsim.ranges", "ddlsim.compare",
               "ddlsim.commprofile", "ddlsim.commdiff")),
    ("report", ("ddlsim.report", "ddlsim.sweepreport", "ddlsim.plots", "ddlsim.framehtml")),
    ("cli", ("ddlsim.cli", "ddlsim.cligroups", "ddlsim.clioutput", "ddlsim.cliutil",
             "ddlsim.searchcli",
             "ddlsim.topologies.cli", "ddlsim.calibration.cli", "ddlsim.importers.cli",
             "ddlsim.traces.cli",
             "ddlsim.calibration.__main__", "ddlsim.__main__")),
    ("package", ("ddlsim",)),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name → source file, for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], deferred: bool = False):
    """The import statements of ``body`` that run when the module is imported (with
    ``deferred``, also those inside functions); never those under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _imports(node.body, deferred)
            yield from _imports(node.orelse, deferred)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                yield from _imports(block, deferred)
        elif isinstance(node, (ast.With, ast.ClassDef, ast.For, ast.While)):
            yield from _imports(node.body, deferred)
        elif deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(node.body, deferred)


def _targets(node: ast.stmt, name: str, is_package: bool, known: set[str]) -> list[str]:
    """The ddlsim modules one import statement of module ``name`` imports directly."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = [target] if target in known else []
    out += [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    return out


def empty_packages(files: dict[str, Path]) -> set[str]:
    """The packages whose ``__init__.py`` holds nothing but its docstring: importing one runs
    no code, so an import that passes through it depends on the module imported, not on it."""
    out = set()
    for name, path in files.items():
        if path.name == "__init__.py":
            body = ast.parse(path.read_text(encoding="utf-8"), str(path)).body
            if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                   and isinstance(n.value.value, str) for n in body):
                out.add(name)
    return out


def import_graph(root: Path = ROOT, deferred: bool = False) -> nx.DiGraph:
    """The import graph of the package under ``root``: module-level imports, and with
    ``deferred`` the imports inside functions too (see the module's text). The packages
    above an imported module are edges too, unless their ``__init__`` is empty
    (:func:`empty_packages`)."""
    files = modules(root)
    known = set(files)
    empty = empty_packages(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        above = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        for node in _imports(tree.body, deferred):
            for target in _targets(node, name, is_package, known):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    step = ".".join(parts[:i])
                    if step in empty and step != target:
                        continue
                    if step not in above and step != name:
                        graph.add_edge(name, step, line=node.lineno)
    return graph


def loads_by_name(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """``(module, line, named)`` for each string in a module's source that names another
    ddlsim module (absolute, or relative to the module's package as ``lazy_exports`` tables
    write them; the first line per pair; not the root package nor the ``ddlsim.data``
    resources): loads by name (``importlib.import_module``, lazy re-exports, lists of
    built-in plugins), which :func:`import_graph` does not count as imports."""
    files = modules(root)
    out = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            named = package + text if text.startswith(".") and text[1:2].isalpha() else text
            if named in files and named not in (name, "ddlsim", "ddlsim.data"):
                out.append((name, node.lineno, named))      # ddlsim.data: resources only
    first = {}
    for module, line, named in sorted(out):
        first.setdefault((module, named), line)
    return sorted((m, line, n) for (m, n), line in first.items())


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the layer whose longest prefix names ``module``."""
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise SystemExit(f"error: module {module} is in no layer of LAYERS; add it")
    return index


def circles(graph: nx.DiGraph) -> list[list[str]]:
    """The strongly connected components of more than one module, largest first."""
    comps = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    return sorted(comps, key=lambda c: (-len(c), c))


def upward(graph: nx.DiGraph) -> list[tuple[str, str, int]]:
    """Edges ``(importer, imported, line)`` from a lower layer to a higher one."""
    return sorted((a, b, d["line"]) for a, b, d in graph.edges(data=True)
                  if layer(a) < layer(b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="print the figures only")
    parser.add_argument("--deferred", action="store_true",
                        help="count the imports inside functions too")
    args = parser.parse_args(argv)
    graph = import_graph(deferred=args.deferred)
    found, up = circles(graph), upward(graph)
    kind = "imports (deferred included)" if args.deferred else "module-level imports"
    config = next((len(c) for c in found if "ddlsim.config" in c), 0)
    print(f"modules {graph.number_of_nodes()}, {kind} {graph.number_of_edges()}; "
          f"circles {len(found)} of {', '.join(str(len(c)) for c in found) or 'no'} modules; "
          f"through ddlsim.config: {f'one of {config} modules' if config else 'none'}; "
          f"upward imports {len(up)}")
    named = loads_by_name()
    print(f"loads by name (a string naming a module; not counted above): {len(named)} in "
          f"{len({m for m, _, _ in named})} modules")
    if args.quiet:
        return 0
    for i, comp in enumerate(found, 1):
        print(f"\ncircle {i} ({len(comp)} modules):")
        sub = graph.subgraph(comp)
        for a, b, d in sorted(sub.edges(data=True)):
            print(f"  {a}:{d['line']} -> {b}")
    if up:
        print("\nupward imports (importer:line -> imported, layers):")
    for a, b, line in up:
        print(f"  {a}:{line} -> {b}  ({LAYERS[layer(a)][0]} -> {LAYERS[layer(b)][0]})")
    if named:
        print("\nloads by name (module:line -> named):")
    for a, line, b in named:
        print(f"  {a}:{line} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
