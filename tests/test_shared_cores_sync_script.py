"""benchmarks/shared_cores_sync.py: bad options are refused naming the values; one short
run prints a row per rank count and work (needs mpirun and mpi4py)."""

from __future__ import annotations

import pytest

from benchscripts import load_script


def test_bad_options_are_refused_naming_them(capsys):
    script = load_script("shared_cores_sync")
    for argv in (["--ranks", "x"], ["--ranks", "0"], ["--work-ms", "-1"]):
        with pytest.raises(SystemExit):
            script.main(argv)
        err = capsys.readouterr().err
        assert "--ranks" in err and "Traceback" not in err


def test_one_rank_spins_its_work_and_prints_the_row(capsys):
    pytest.importorskip("mpi4py")
    from ddlsim.reference.mpijobs import mpirun
    try:
        mpirun(1)
    except FileNotFoundError:
        pytest.skip("mpirun is not installed (pip install 'ddlsim[mpi]')")
    script = load_script("shared_cores_sync")
    assert script.main(["--ranks", "1", "--work-ms", "5"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[2:]]
    assert len(rows) == 1 and rows[0][:2] == ["1", "5.0"]
    wall = float(rows[0][2])
    assert 4.5 <= wall <= 20.0  # a round is at least its 5 ms of work
