"""NCCL's collective algorithms and protocols, timed by its tuning model (:mod:`.model`,
constants in :mod:`.tuning`), registered as the ``nccl`` backend's algorithms."""

from .choice import NCCL_ORDER, nccl_choice
from .model import (ALGORITHMS, NcclEnv, algbw_GBps, available, best_protocol, busbw_GBps,
                    latency_us, nccl_time)
from .system import env_for_system
from . import flows, p2p  # noqa: F401  (register the nccl_* algorithms)

__all__ = ["NcclEnv", "nccl_time", "busbw_GBps", "algbw_GBps", "latency_us", "best_protocol",
           "available", "ALGORITHMS", "env_for_system", "nccl_choice", "NCCL_ORDER"]
