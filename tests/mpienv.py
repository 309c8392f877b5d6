"""The environment tests start Open MPI with (``mpirun`` or an MPI singleton)."""

from __future__ import annotations

import os


def mpi_env(**extra: str) -> dict[str, str]:
    """``os.environ`` now, with Open MPI's permission to run as root (it refuses without
    both variables, and CI containers run as root) and ``extra``."""
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            **extra}


def run_two_ranks(script, *args: str, timeout: float = 120):
    """``mpirun -n 2 python SCRIPT ARGS`` under the closed loop's MPI environment, its
    completed process; the test is skipped without mpi4py or mpirun."""
    import subprocess
    import sys

    import pytest
    pytest.importorskip("mpi4py")
    from ddlsim.reference.mpijobs import mpi_env as loop_env, mpirun
    try:
        cmd = mpirun(2)
    except FileNotFoundError:
        pytest.skip("mpirun is not installed")
    return subprocess.run([*cmd, sys.executable, str(script), *args], capture_output=True,
                          text=True, env=loop_env(), timeout=timeout)
