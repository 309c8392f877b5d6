"""Step 2 of ``proxies_check.py``: this machine's MPI calibrated at each rank count over the
calls the proxies' runs issue (:func:`calibrate`, by the closed loop's recipe), the link each
run's largest message gives (:func:`link_sets`), and the load read beside each measurement
(:func:`load`), and the other jobs' runnable tasks right before a launch (:func:`background`)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from proxies_table import PROXIES, Proxy, comm_calls

__all__ = ["calibration_range", "calibration_args", "calibrate", "link_sets", "fit_errors",
           "load", "background", "busy", "first_touch_sets"]


def calibration_range(sizes: list[float]) -> tuple[int, int]:
    """Bytes to calibrate, by the closed loop's rule (``ddlsim.reference.loop.comm_sizes``).

    Parameters
    ----------
    sizes : list of float
        Bytes per call of the runs' collectives.

    Returns
    -------
    (int, int)
        The power of two at or below a quarter of the smallest size (at least 8 B), so that a
        cache cliff just below the runs' messages has three sizes under it too, and eight
        times the next power of two above the largest (three sizes past any cliff for
        ``calibrate fit --min-points 3``), in bytes.
    """
    low = 2 ** math.floor(math.log2(max(min(sizes) / 4, 8)))
    return low, 8 * 2 ** math.ceil(math.log2(max(sizes)))


def calibration_args(sizes: list[float]) -> list[str]:
    """``calibrate comm``'s size options for collectives of ``sizes`` bytes per call: the range
    of :func:`calibration_range` in steps of the closed loop's
    :data:`ddlsim.reference.loop.COMM_FACTOR` (two sizes an octave; one an octave lumped the
    one or two sizes below a shared-memory cache cliff with those above it, and ``calibrate
    fit`` refused the curve, as that constant's comment records)."""
    from ddlsim.reference.loop import size_args
    return size_args(*calibration_range(sizes))


def calibrate(work: Path, names: list[str], ranks: int = 2, clock: str = "wall",
              attempts: int = 3, max_rel_rmse: float = 0.25, cores: int | None = None) -> Path:
    """Step 2 of ``proxies_check.py``'s docstring for the proxies ``names`` run on ``ranks``
    ranks: the profile (a YAML path) of the collectives and sizes those runs issue, measured
    on ``ranks`` ranks (sharing the cores when there are more ranks than cores) with
    ``clock``.
    A fit that ``calibrate fit`` refuses (a curve missing its own points by more than
    ``max_rel_rmse``: the machine's load) is measured again, ``attempts`` times at most.
    ``cores``: the host's usable cores when it is described by them (``proxies_check.py
    --host``, :func:`proxies_table.system_sets`)."""
    from ddlsim.reference.loop import COMM_STATISTIC
    from ddlsim.reference.mpijobs import check_job, cpu_cores, mpirun, run_job
    calls = {c for name in names if PROXIES[name].runs_at(ranks, cores)
             for c in comm_calls(PROXIES[name], ranks, cores)}
    # sendrecv: the link (a ping-pong); exchange: every rank's transfer at once, which
    # the engines time a class's sends on one node by (ddlsim.simulator.sharedcopies)
    ops = sorted({op for op, _ in calls} | {"sendrecv", "exchange"})
    sizes = calibration_args([b for _, b in calls] or [8.0])
    csv, profile = work / f"mpi{ranks}.csv", work / f"profile{ranks}.yaml"
    shared = ["--allow-shared-cores"] if ranks > cpu_cores() else []
    for attempt in range(1, attempts + 1):
        print(f"calibrating {', '.join(ops)} on {ranks} ranks, {' '.join(sizes)}, {clock} clock"
              f" (attempt {attempt}; {load()})", flush=True)
        check_job(run_job(["nice", *mpirun(ranks), sys.executable, "-m", "ddlsim.calibration",
                           "comm", "--backend", "mpi", "--ops", ",".join(ops), *sizes,
                           "--warmup", "2", "--reps", "20",
                           "--clock", clock, "--no-progress", *shared, "-o", str(csv),
                           "--force"], 1800),
                  "calibrate comm")
        proc = run_job([sys.executable, "-m", "ddlsim.calibration", "fit", str(csv), "-o",
                        str(profile), "--statistic", COMM_STATISTIC, "--bootstrap", "0",
                        "--max-rel-rmse", str(max_rel_rmse), "--force"], 300)
        if proc.returncode == 0:
            print("  fitted, relative RMS error: " + ", ".join(
                f"{op} {100 * e:.1f} %" for op, e in fit_errors(profile).items()), flush=True)
            check_job(run_job(["nice", sys.executable, "-m", "ddlsim.calibration",
                               "first-touch", str(profile)], 300), "calibrate first-touch")
            return profile
        print("  " + " ".join(proc.stderr.split())[:600], flush=True)
    raise RuntimeError(f"calibrate fit refused {attempts} calibrations; see above")


def link_sets(proxy: Proxy, n: int, profile: Path, cores: int | None = None) -> list[str]:
    """``--set`` values of :data:`SYSTEM`'s link (intra-node, and the NIC that repeats it) from
    the profile's sendrecv fit at the n-rank run's largest message
    (:func:`ddlsim.calibration.linkfit.measured_link`): the preset's own link is that fit at 2
    ranks under another day's load.

    Parameters
    ----------
    proxy : Proxy
        The proxy whose n-rank run's messages are sized (:func:`comm_calls`).
    n : int
        Ranks.
    profile : Path
        Calibration profile with a ``sendrecv`` fit (step 2).
    cores : int, optional
        The host's usable cores (``--host``); None: :data:`proxies_table.SYSTEM` as it is.

    Returns
    -------
    list of str
        ``system.intra_node.*`` and ``system.nic.*`` bandwidth (B/s) and latency (s); none
        when the run sends nothing.
    """
    from ddlsim.calibration.linkfit import measured_link
    from ddlsim.calibration.profile import CalibrationProfile
    sizes = [b for _, b in comm_calls(proxy, n, cores)]
    if not sizes:
        return []
    link = measured_link(CalibrationProfile.load(profile), max(sizes), n)
    return [f"system.{part}.{key}={getattr(link, key)!r}" for part in ("intra_node", "nic")
            for key in ("bandwidth_Bps", "latency_s")]


def first_touch_sets(profile: Path) -> list[str]:
    """``--set`` values of ``system.first_touch`` from a profile's first-touch measurement
    (``ddlsim calibrate first-touch``): for rows whose own profiles predate it.

    Parameters
    ----------
    profile : Path
        A calibration profile with ``first_touch``.

    Returns
    -------
    list of str
        ``system.first_touch.{s_per_page,page_bytes,source}``.
    """
    from ddlsim.calibration.profile import CalibrationProfile
    entry = CalibrationProfile.load(profile).doc.first_touch
    if entry is None:
        raise ValueError(f"--first-touch {profile}: the profile has no first_touch "
                         "measurement; add one with `ddlsim calibrate first-touch PROFILE`")
    import json
    return [f"system.first_touch.s_per_page={entry.s_per_page!r}",
            f"system.first_touch.page_bytes={entry.page_bytes}",
            f"system.first_touch.source={json.dumps(f'{profile}: {entry.source}')}"]


def fit_errors(profile: Path) -> dict[str, float]:
    """Operation -> the relative RMS error of its fitted curve (``calibrate fit``'s figure)."""
    from ddlsim.calibration.profile import CalibrationProfile
    return {e.op: e.rel_rmse for e in CalibrationProfile.load(profile).doc.comm}


def load() -> str:
    """The 1-minute load average and the CPU pressure "some" avg10 (% of time some runnable
    task waited for a core), read now."""
    avg = Path("/proc/loadavg").read_text().split()[0]
    try:
        some = Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1]
    except (OSError, IndexError):
        some = "n/a"
    return f"load {avg}, cpu pressure {some} %"


def background(seconds: float = 1.0, samples: int = 100) -> float:
    """The mean number of runnable tasks other than this sampler over ``seconds``: the other
    jobs that want a core right before a launch (``/proc/loadavg``'s fourth field, runnable
    over total scheduling entities, read ``samples`` times; proc(5)).

    Unlike the 1-minute load average (:func:`load`), it does not carry the calibration that
    ran just before (its ranks have exited), so it can say whether the machine is free."""
    import time
    got = []
    for _ in range(samples):
        got.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
        time.sleep(seconds / samples)
    return sum(got) / len(got)


def busy(row: dict, cores: int) -> str | None:
    """Why a row's machine was not the one predicted, or None: the other jobs' runnable tasks
    (:func:`background`, read right before and after the launches) and the
    proxy's ranks outnumbered the cores by more than half a task.

    ddlsim predicts the ranks alone on the node's cores (one per core, or time-shared among
    the ranks past them, :mod:`ddlsim.topologies.sharedcores`). Linux's CFS shares a core among
    all runnable tasks in proportion to their weights, and a ``nice`` 10 rank weighs 110
    against a nice-0 task's 1024 (kernel/sched/core.c, sched_prio_to_weight), so each other
    job on a core the ranks need takes most of it: the iteration then depends on jobs no
    prediction of this machine knows. Rows saved before ``background`` was recorded are
    refused too (their load average includes the calibration that ran just before)."""
    if "background" not in row:
        return "no count of the other jobs' runnable tasks before its launches (older row)"
    others = max(row["background"])
    spare = max(cores - row["ranks"], 0)
    if others <= spare + 0.5:
        return None
    return (f"{others:.1f} other runnable tasks beside its {row['ranks']} rank(s) on "
            f"{cores} cores ({spare} spare): each rank shares a core with other jobs")
