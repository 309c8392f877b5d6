"""Every validation table in docs/validation.md is what its command writes now (the project's
rule: every accuracy figure in the docs comes from a command in the repo). Each script with
``--write-docs`` is run on a copy of the page; the copy must come back unchanged. A prediction
change that moves a published comparison fails here until the table is regenerated
(``python benchmarks/validate_<name>.py --write-docs``), so the page cannot go stale as Table
1's section did (2.87 % on the page for two days while the command said 2.57 %)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import warnings

import pytest

from benchscripts import BENCH

#: the scripts that write a block of docs/validation.md (``--write-docs``)
SCRIPTS = sorted(p.stem for p in BENCH.glob("validate_*.py")
                 if "--write-docs" in p.read_text())


def test_every_writing_script_is_listed():
    assert {"validate_megatron", "validate_moe", "validate_nccl", "validate_resnet"} <= \
        set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_page_holds_what_the_command_writes(name, tmp_path, monkeypatch, capsys):
    import public_runs
    page = public_runs.DOC
    copy = tmp_path / "validation.md"
    shutil.copyfile(page, copy)
    monkeypatch.setattr(public_runs, "DOC", copy)
    # a fresh module, registered under its name while it runs (its dataclasses look their
    # module up by name)
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, script)
    spec.loader.exec_module(script)
    if hasattr(script, "DOC"):
        monkeypatch.setattr(script, "DOC", copy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert script.main(["--write-docs"]) in (0, None)
    capsys.readouterr()
    if copy.read_text() != page.read_text():
        pytest.fail(f"docs/validation.md is not what `python benchmarks/{name}.py "
                    "--write-docs` writes: run it and commit the page")
