"""The environment tests start Open MPI with (``mpirun`` or an MPI singleton)."""

from __future__ import annotations

import os


def mpi_env(**extra: str) -> dict[str, str]:
    """``os.environ`` now, with Open MPI's permission to run as root (it refuses without
    both variables, and CI containers run as root) and ``extra``."""
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            **extra}
