"""Ranks sharing the cores of a CPU node: the system each rank sees when a node runs more MPI
ranks than it has cores (``mpirun --oversubscribe``).

A CPU system preset is one device per core (``kvm-2core``: 2 cores, 2 devices). A node whose
``c`` cores run ``r > c`` ranks time-shares them: Linux's CFS scheduler gives every runnable
task of equal weight an equal share of the CPU (the kernel's CFS design document,
``Documentation/scheduler/sched-design-CFS.rst``: "an 'ideal, precise multi-tasking CPU'
... each task runs at 1/nr_running speed"), so a rank that computes gets ``c / r`` of a
core: its device is the core's peak FLOP/s, memory bandwidth and memory scaled by ``c / r``,
and the per-kernel host times of ``device.launch`` (a framework's dispatch, which runs on the
same cores) by ``r / c``.

What this does *not* derive is communication. Open MPI's shared-memory transport progresses
a collective only while a rank polls inside MPI, and a rank that waits polls on a core that
another rank needs; with ``mpi_yield_when_idle`` it gives the core up at each poll
(``ompi_info --param mpi all``). How long a collective takes then depends on the scheduler,
the algorithm Open MPI's ``coll/tuned`` picks for the size and how many ranks wait, which no
closed form here captures: it is *measured* at ``r`` ranks on the same cores
(``ddlsim calibrate comm --backend mpi --allow-shared-cores --clock wall``) and given to
``predict`` as a profile (``--calibration``), whose fits are kept per rank count. Without
such a profile the link figures of the preset (measured at one rank per core) would be used,
which is why :func:`share_cores` alone is not a prediction of the MPI time.

**Uneven shares are refused.** The fair share holds when the ranks are a multiple of the
cores: every core's run queue then holds as many ranks. Otherwise (3 ranks on 2 cores) one
core runs two ranks and the other one; Linux keeps a run queue per CPU and moves tasks
between them only when it balances load (Documentation/scheduler/sched-domains.rst), and a
rank that waits in MPI polls on its core instead of leaving it idle, so a phase of equal work
between two synchronisations runs at the busiest core's pace until the balancer steps in.
``benchmarks/shared_cores_sync.py`` measured it on this project's 2-core machine (each rank
spins W of CPU time, then ``MPI_Barrier``; 2026-12-01): 3 ranks took 2.00 W a round for W of
2-10 ms, 1.82 W at 50 ms, 1.68 W at 100 ms, 1.58 W at 500 ms, where the fair share gives
1.5 W (2 and 4 ranks: the fair share, within 2 %). How far a run falls between the two
depends on how long its phases are and on how its ranks wait (busy polling or sleeping), which
no closed form here follows, so :func:`share_cores` refuses such a count
(:func:`uneven_refusal`) and the reference loops count those runs as refused.

It is an estimate a user asks for by name, not what ``ddlsim predict`` answers on the preset:
there, one device per core, a plan of more ranks than cores is refused (the plan's ranks
against the system's devices), and ``benchmarks/proxies_check.py`` counts such runs as
refused, with that refusal, printing this estimate beside them (docs/validation.md: at 4
and 8 ranks on 2 cores it missed the seed's proxies by 36 % on average, 2026-11-29).
"""

from __future__ import annotations

from ..config_system import SystemConfig
from ..errors import ConfigError

__all__ = ["share_cores", "shared_core_overrides", "uneven_refusal"]


def _check(system: SystemConfig, ranks_per_node: int) -> float:
    """``cores / ranks`` of one node, or a ConfigError naming the field and what is allowed."""
    if system.nodes != 1:
        raise ConfigError(f"system.nodes = {system.nodes}: ranks sharing cores are modelled on "
                          f"one node only (a calibration at that rank count measures them)")
    cores = system.devices_per_node
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) \
            or ranks_per_node < cores:
        raise ConfigError(f"ranks per node = {ranks_per_node!r}: sharing the {cores} cores of "
                          f"'{system.name}' needs an integer of at least {cores}")
    refusal = uneven_refusal(cores, ranks_per_node, system.name)
    if refusal:
        raise ConfigError(refusal)
    return cores / ranks_per_node


def uneven_refusal(cores: int, ranks: int, name: str = "this node") -> str | None:
    """Why ``ranks`` that do not divide evenly over ``cores`` are refused (module docstring,
    "Uneven shares"), naming the counts and what is allowed; None where they divide.

    Parameters
    ----------
    cores : int
        The node's usable cores.
    ranks : int
        Ranks started on it, at least ``cores``.
    name : str
        The system or machine, for the message.
    """
    if ranks % cores == 0:
        return None
    return (f"ranks per node = {ranks} on the {cores} cores of '{name}': ranks sharing cores "
            f"are modelled when they divide evenly over them (each core's run queue as long); "
            f"with {ranks} on {cores} some cores run {-(-ranks // cores)} ranks and others "
            f"{ranks // cores}, and Linux moves ranks between the run queues only when it "
            f"balances them, so a phase between synchronisations runs at up to the busiest "
            f"core's pace (3 ranks on 2 cores measured 1.58-2.00 W a phase of W against the "
            f"fair share's 1.5 W, benchmarks/shared_cores_sync.py), which is not modelled; "
            f"allowed: a multiple of {cores} ranks")


def share_cores(system: SystemConfig, ranks_per_node: int) -> SystemConfig:
    """The system of one CPU node whose cores are time-shared by ``ranks_per_node`` ranks.

    Parameters
    ----------
    system : SystemConfig
        One node, one device per core (``devices_per_node`` = cores).
    ranks_per_node : int
        MPI ranks started on the node, at least its cores.

    Returns
    -------
    SystemConfig
        ``devices_per_node`` = ``ranks_per_node``; each device's peak FLOP/s (every dtype),
        memory bandwidth (B/s) and memory (bytes) × cores / ranks, its ``launch`` times
        (seconds of CPU work per kernel) × ranks / cores; links and the rest unchanged
        (communication comes from a calibration at this rank count).

    Raises
    ------
    ConfigError
        More than one node, fewer ranks than cores, or ranks that are not a multiple of the
        cores (module docstring, "Uneven shares").

    References
    ----------
    Linux CFS design (Documentation/scheduler/sched-design-CFS.rst): equal-weight runnable
    tasks share a CPU equally.
    """
    share = _check(system, ranks_per_node)
    d = system.device
    update = {"peak_flops": {k: v * share for k, v in d.peak_flops.items()},
              "memory_bandwidth_Bps": d.memory_bandwidth_Bps * share,
              "memory_bytes": d.memory_bytes * share}
    if d.launch is not None:  # the host's work per kernel runs on the same shared cores
        update["launch"] = d.launch.model_copy(update={
            k: getattr(d.launch, k) / share
            for k in ("host_launch_s", "eager_op_s", "stream_gap_s", "graph_gap_s")})
    device = d.model_copy(update=update)
    data = system.model_dump()
    data.update(devices_per_node=ranks_per_node, device=device.model_dump(),
                name=f"{system.name}-x{ranks_per_node}")
    return SystemConfig.model_validate(data)


def shared_core_overrides(system: SystemConfig, ranks_per_node: int) -> list[str]:
    """:func:`share_cores` as ``--set`` values on a run config whose ``system.preset`` is
    ``system`` (for ``ddlsim predict``).

    Parameters
    ----------
    system : SystemConfig
        The preset's one-device-per-core system.
    ranks_per_node : int
        MPI ranks on its node.

    Returns
    -------
    list of str
        ``system.devices_per_node=…`` and ``system.device.…=…`` in SI units (FLOP/s, B/s,
        bytes, seconds).
    """
    shared = share_cores(system, ranks_per_node)
    d = shared.device
    launch = [] if d.launch is None else [
        f"system.device.launch.{k}={getattr(d.launch, k)!r}"
        for k in ("host_launch_s", "eager_op_s", "stream_gap_s", "graph_gap_s")]
    return ([f"system.devices_per_node={ranks_per_node}"]
            + [f"system.device.peak_flops.{k}={v!r}" for k, v in sorted(d.peak_flops.items())]
            + [f"system.device.memory_bandwidth_Bps={d.memory_bandwidth_Bps!r}",
               f"system.device.memory_bytes={d.memory_bytes!r}"] + launch)
