"""Collective algorithms: the registry and :class:`GroupNet`/:class:`Phase` (:mod:`.base`),
the generic MPI-style algorithms (:mod:`.mpi`) and NCCL's (:mod:`.nccl`), registered on
import."""

from .base import (BACKENDS, BUSBW_FACTOR, Algorithm, GroupNet, Phase, algorithms_for,
                   best_algorithm, best_uneven_algorithm, collective_time, get_algorithm,
                   register, register_uneven, registry_generation, split_matrix,
                   split_weights, uneven_time)
from . import mpi  # noqa: F401,E402  (registers the generic algorithms)
from . import openmpi  # noqa: F401,E402  (registers Open MPI's allgather_reduce)
from . import nccl  # noqa: F401,E402  (registers NCCL's algorithms)
from . import flex  # noqa: F401,E402  (resolves the flex dispatcher's kernels by name)

__all__ = ["GroupNet", "Phase", "Algorithm", "register", "get_algorithm", "algorithms_for",
           "collective_time", "best_algorithm", "BUSBW_FACTOR", "register_uneven",
           "split_matrix", "split_weights", "uneven_time", "best_uneven_algorithm", "BACKENDS",
           "registry_generation"]
