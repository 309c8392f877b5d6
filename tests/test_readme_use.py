"""The README's Use block runs top to bottom in a fresh clone without an error (issue 31).

The tracked files are copied to a new folder (what ``git clone`` gives: no outputs left from
an earlier run), and every ``ddlsim`` line of the block runs there in order, through the
command line in this process (later lines read what earlier ones wrote: ``r.json``). The one
line that is not a ``ddlsim`` command, ``python benchmarks/closed_loop.py`` (MPI training,
minutes), is left to ``tests/test_closed_loop.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddlsim.cli import app

REPO = Path(__file__).resolve().parents[1]


def use_block_commands(readme: str) -> list[str]:
    """The ``ddlsim`` command lines of the README's first bash block under ``## Use``:
    continuation lines joined, comments dropped."""
    block = readme.split("\n## Use", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line.startswith("ddlsim"):
            continue
        words = shlex.split(line, comments=True)
        commands.append(shlex.join(words))
    return commands


def fresh_clone(dest: Path) -> None:
    """The tracked files of the repository under ``dest``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: no list of tracked files to clone")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def test_the_use_block_is_what_the_readme_says():
    commands = use_block_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert commands[0] == "ddlsim predict examples/gpt3-175b-1024-a100.yaml"
    assert all(c.startswith("ddlsim ") for c in commands) and len(commands) >= 20
    block = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Use", 1)[1]
    others = [ln.split("#")[0].strip() for ln in block.split("```", 2)[1].splitlines()[1:]
              if ln.strip() and not ln.startswith((" ", "ddlsim"))]
    assert others == ["python benchmarks/closed_loop.py"], others  # see the module docstring
    outputs = [c.split(" -o ")[1].split()[0] for c in commands if " -o " in c]
    written = [o for o in outputs if o != "-"]
    assert len(written) == len(set(written)), f"two commands write the same file: {written}"


@pytest.mark.slow
def test_the_use_block_runs_top_to_bottom_in_a_fresh_clone(tmp_path):
    fresh_clone(tmp_path)
    commands = use_block_commands((REPO / "README.md").read_text(encoding="utf-8"))
    runner = CliRunner()
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for command in commands:
            res = runner.invoke(app, shlex.split(command)[1:])
            assert res.exit_code == 0, f"$ {command}\n{res.output[-2000:]}"
    finally:
        os.chdir(here)
