"""Which collective backend a system runs, and the NCCL options it refuses where NCCL does not
run: ``system.collectives.nccl_version``, ``nccl_protocol`` and ``gpu_arch`` tell NCCL's
tuning model how to time and choose NCCL's algorithms (:mod:`.nccl`), so on an MPI backend
(``mpi``, ``mpich``, ``openmpi``, or ``auto`` on a system without NVLink GPUs) they would be
ignored silently, unless the plan pins a collective to one of NCCL's algorithms
(``parallel.collective_algorithm``), which NCCL's model then times."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import SystemConfig
from ..errors import ConfigError

__all__ = ["resolve_backend", "NCCL_ONLY"]

#: NCCL-only fields of ``system.collectives`` → their default: set to another value, they are
#: refused where NCCL does not run. The default release counts as not set, so that a config
#: written out whole (``model_dump``, ``ddlsim import``) reads back on an MPI system.
NCCL_ONLY = {"nccl_version": "2.30.7", "nccl_protocol": "auto", "gpu_arch": "auto"}


def resolve_backend(system: SystemConfig,
                    collective_algorithm: Mapping[str, str] | None = None) -> tuple[str, object]:
    """The backend the collectives run on and NCCL's view of the machine.

    Parameters
    ----------
    system : SystemConfig
        The cluster; ``system.collectives`` picks the backend (``auto``: NCCL on NVLink nodes
        of a known GPU generation, MPI otherwise).
    collective_algorithm : mapping of str to str, optional
        The plan's algorithm per collective op (``parallel.collective_algorithm``); one of
        NCCL's there uses the NCCL fields on any backend.

    Returns
    -------
    (str, NcclEnv or None)
        ``nccl``, ``mpi``, ``mpich`` or ``openmpi``, and NCCL's view of the machine (None
        where the GPU generation is unknown).

    Raises
    ------
    ConfigError
        ``backend: nccl`` without a known GPU generation; an NCCL-only field set where the
        collectives do not run on NCCL, naming the field, its value and the backend.
    """
    from .collectives.nccl import env_for_system

    env = env_for_system(system)
    spec = system.collectives
    backend = spec.backend
    if backend == "auto":
        backend = "nccl" if env is not None and env.intra == "nvlink" else "mpi"
    if backend == "nccl" and env is None:
        raise ConfigError(f"system.collectives.backend = 'nccl' needs the GPU generation for "
                          f"NCCL's tuning model, but device.name {system.device.name!r} names "
                          "none; set system.collectives.gpu_arch to volta, ampere, hopper or "
                          "blackwell")
    if backend != "nccl" and not _pins_nccl(collective_algorithm):
        _refuse_nccl_fields(spec, backend)
    return backend, env


def _pins_nccl(collective_algorithm: Mapping[str, str] | None) -> bool:
    """Whether the plan pins a collective to one of NCCL's algorithms."""
    from .collectives import get_algorithm
    return any(name != "auto" and get_algorithm(op, name).backend == "nccl"
               for op, name in (collective_algorithm or {}).items())


def _refuse_nccl_fields(spec, backend: str) -> None:
    """Refuse each NCCL-only field of ``spec`` set away from its default, the collectives
    running on ``backend``."""
    for field, default in NCCL_ONLY.items():
        value = getattr(spec, field)
        if value != default:
            raise ConfigError(
                f"system.collectives.{field} = {value!r} applies to NCCL's collectives, but "
                f"they run on {backend!r} here (backend = {spec.backend!r}: NCCL only on "
                f"NVLink nodes of a known GPU generation under 'auto'), and no "
                f"parallel.collective_algorithm names an NCCL algorithm; remove {field} or "
                f"set backend: nccl")
