"""``ddlsim calibrate``: run benchmarks, read existing results, fit and show profiles.

The sub-app is :data:`app` (mounted by ``ddlsim/cli.py``); ``python -m ddlsim.calibration``
runs it stand-alone, which is what ``mpirun``/``torchrun`` launch.
"""

from __future__ import annotations

import functools
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import DDLSimError
from ..units import UnitError, parse_bytes, parse_flops
from .schema import DEFAULT_MAX_REL_RMSE, DEFAULT_MAX_SKIPPED_SHARE, OPS, CalibrationError

__all__ = ["app"]

app = typer.Typer(help="Calibrate ddlsim against a real cluster: run communication and "
                       "compute benchmarks, read nccl-tests/OSU results, fit α-β profiles.",
                  no_args_is_help=True, rich_markup_mode="rich")
_err = Console(stderr=True)


def _friendly(fn):
    """Errors ddlsim raises on purpose print as one paragraph and exit with status 2."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (DDLSimError, UnitError, OSError) as exc:
            _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False,
                       soft_wrap=True)
            raise typer.Exit(2) from None
    return run


def _split_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise CalibrationError(f"{what} {bad[0] if bad else text!r} is not allowed; choose "
                               f"from {', '.join(allowed)}")
    return items


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise CalibrationError(f"{what} {value!r} is not allowed; choose from "
                               f"{', '.join(allowed)}")
    return value


# ----------------------------------------------------------------------------------- comm
COMM_HELP = """Time collectives and send/recv ping-pong on every rank; rank 0 writes a CSV.

Launch it with one process per device:

[bold]MPI (CPU or GPU-aware MPI):[/]
  mpirun -n 16 --map-by ppr:8:node python -m ddlsim.calibration comm --backend mpi -o mpi.csv
  srun -N 2 --ntasks-per-node 8 python -m ddlsim.calibration comm --backend mpi -o mpi.csv

[bold]NCCL / Gloo through torch.distributed:[/]
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m ddlsim.calibration comm --backend nccl -o nccl.csv

When ranks span nodes, intra-node and inter-node sub-communicators are measured too. Next
to the CSV goes NAME.meta.yaml (hosts, versions, command line, date)."""


@app.command(help=COMM_HELP)
@_friendly
def comm(backend: str = typer.Option("mpi", help="mpi (mpi4py) | nccl | gloo (torch)"),
         ops: str = typer.Option(",".join(OPS), help="comma-separated operations"),
         min_bytes: str = typer.Option("8", help="smallest message, e.g. 8 or '1 KiB'"),
         max_bytes: str = typer.Option("512 MiB", help="largest message, e.g. '1 GiB' "
                                       "(a profile is used only up to the largest size it "
                                       "measured; about 2× this per rank is allocated)"),
         factor: float = typer.Option(2.0, help="size step factor"),
         warmup: int = typer.Option(5, help="untimed calls per size"),
         reps: int = typer.Option(20, help="timed batches per size up to 16 MiB, halved "
                                  "per doubling above it, down to 5"),
         batch: int = typer.Option(1, help="calls per timed batch"),
         split: bool = typer.Option(True, help="also measure intra/inter-node sub-communicators"),
         output: Path = typer.Option(Path("ddlsim-comm.csv"), "-o", "--output"),
         force: bool = typer.Option(False, help="overwrite existing output files"),
         progress: bool = typer.Option(True, help="progress bar on rank 0"),
         allow_shared_cores: bool = typer.Option(False, help="measure even when ranks on a "
                                                 "node outnumber its usable CPU cores"),
         clock: str = typer.Option("wall", help="wall | cpu: the CPU time each rank got (mpi, "
                                   "gloo; not inflated while other processes hold a core; "
                                   "the max over ranks)")) -> None:
    from .comm_bench import (CLOCKS, TAPER_FROM_BYTES, check_cores, default_sizes, planned_steps,
                             run_scoped_benchmarks, scoped_communicators)
    from .comm_launch import agree_on_outputs, open_adapter, progress_bar, write_comm

    _choice(backend, ("mpi", "nccl", "gloo"), "--backend")
    _choice(clock, tuple(CLOCKS), "--clock")
    if clock == "cpu" and backend == "nccl":
        raise CalibrationError("--clock cpu times the host's CPU, not the GPU's work: use it "
                               "with --backend mpi or gloo, or --clock wall with nccl")
    op_list = _split_list(ops, OPS, "operation")
    sizes = default_sizes(parse_bytes(max_bytes), parse_bytes(min_bytes), factor)
    adapter = open_adapter(backend)
    try:
        agree_on_outputs(adapter, output, force)
        check_cores(adapter, allow_shared_cores)
        comms = scoped_communicators(adapter, split)
        with progress_bar(progress and adapter.rank == 0,
                           planned_steps(op_list, sizes, len(comms))) as tick:
            rows = run_scoped_benchmarks(adapter, op_list, sizes, warmup, reps, batch=batch,
                                         comms=comms, progress=tick,
                                         taper_from=TAPER_FROM_BYTES, clock=CLOCKS[clock])
        if adapter.rank == 0:
            meta = write_comm(adapter, rows, comms[0][2], output, force,
                              {"ops": op_list, "sizes_bytes": sizes, "warmup": warmup,
                               "reps": reps, "batch": batch, "split": split, "clock": clock,
                               "reps_taper_from_bytes": TAPER_FROM_BYTES})
            _err.print(escape(f"wrote {len(rows)} rows to {output} and {meta}"))
    finally:
        adapter.close()


# -------------------------------------------------------------------------------- compute
@app.command(help="Time GEMMs (numpy on CPU; torch on CPU/GPU) over shapes and dtypes, and "
                  "attention (torch scaled_dot_product_attention) with --attention; writes a "
                  "CSV of achieved FLOP/s.\n\nExample: ddlsim calibrate compute --backend torch "
                  "--device cuda --dtypes bf16,fp16 --max-dim 8192 --attention -o gpu.csv")
@_friendly
def compute(backend: str = typer.Option("numpy", help="numpy | torch"),
            device: str = typer.Option("cpu", help="cpu | cuda (torch only)"),
            dtypes: str = typer.Option("fp32", help="numpy: fp32,fp64; torch: fp32,tf32,fp16,bf16"),
            min_dim: int = typer.Option(32, help="smallest GEMM dimension"),
            max_dim: int = typer.Option(1024, help="largest GEMM dimension"),
            attention: bool = typer.Option(False, help="also time attention (torch)"),
            max_seq: int = typer.Option(1024, help="longest attention sequence"),
            warmup: int = typer.Option(2), reps: int = typer.Option(5),
            seed: int = typer.Option(0, help="seed of the random operands"),
            evict: str = typer.Option("0", help="numpy: read this many bytes before each timed "
                                      "call, e.g. '32 MiB' (operands out of the caches, as in "
                                      "an iteration); 0 times repeated calls on cached operands"),
            output: Path = typer.Option(Path("ddlsim-compute.csv"), "-o", "--output"),
            force: bool = typer.Option(False, help="overwrite an existing output file"),
            limit: list[str] = typer.Option([], "--limit", help="raise a work budget, e.g. "
                                            "--limit bench_samples=20000")) -> None:
    import pandas as pd

    from ..limits import Limits, check_budget
    from .compute_bench import (default_attention_shapes, default_gemm_shapes,
                                run_attention_benchmark, run_gemm_benchmark)
    from .outputs import guard_output, write_csv

    _choice(backend, ("numpy", "torch"), "--backend")
    if reps < 1 or warmup < 0:
        raise CalibrationError(f"need --reps >= 1 and --warmup >= 0, got {reps}, {warmup}")
    dts = [d.strip() for d in dtypes.split(",") if d.strip()]
    shapes = default_gemm_shapes(max_dim, min_dim)
    if attention and backend != "torch":
        raise CalibrationError("--attention needs --backend torch")
    att = default_attention_shapes(max_seq) if attention else []
    check_budget({"bench_samples": (warmup + reps) * (len(shapes) + len(att)) * len(dts)},
                 Limits.from_strings(limit), f"--warmup {warmup} --reps {reps}")
    guard_output(output, force)
    evict_bytes = int(parse_bytes(evict))
    if evict_bytes < 0:
        raise CalibrationError(f"--evict {evict!r} must be 0 or more bytes, e.g. '32 MiB'")
    if evict_bytes and backend != "numpy":
        raise CalibrationError(f"--evict {evict!r} is for --backend numpy only (got "
                               f"{backend!r}); leave it at 0")
    frames = [run_gemm_benchmark(backend, device, dts, shapes, warmup, reps, seed,
                                 evict_bytes=evict_bytes)]
    if attention:
        frames.append(run_attention_benchmark(device, dts, att, warmup, reps, seed))
    df = pd.concat(frames, ignore_index=True)
    write_csv(output, df, force)
    best = df.loc[df["flops_per_s"].idxmax()]
    _err.print(escape(f"wrote {len(df)} rows to {output}; best {best['kind']} {best['dtype']}: "
                      f"{best['flops_per_s'] / 1e9:.3g} GFLOP/s"))


# ------------------------------------------------------------------------------------ fit
def _peaks(peak: list[str], system: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    if system:
        from ..presets import get_preset

        for dtype, value in get_preset("system", system)["device"]["peak_flops"].items():
            out[dtype] = parse_flops(value)
    for item in peak:
        dtype, sep, value = item.partition("=")
        if not sep:
            raise CalibrationError(f"--peak {item!r} must look like 'fp32=7.17 TFLOP/s'")
        out[dtype.strip()] = parse_flops(value.strip())
    return out


@app.command(help="Fit results (ddlsim CSVs, nccl-tests text/JSON, OSU output) into a "
                  "calibration profile YAML. Each row that cannot be used is printed as "
                  "'FILE:LINE: skipped: REASON' and kept in the profile's provenance; a file "
                  "with more than --max-skipped-share of such rows (default 10%) stops the "
                  "fit.\n\nExample: ddlsim calibrate fit mpi.csv "
                  "all_reduce_perf.txt compute.csv -o profile.yaml --system dgx-a100")
@_friendly
def fit(results: list[Path] = typer.Argument(..., help="results files"),
        output: Path = typer.Option(..., "-o", "--output", help="profile YAML to write"),
        format: str = typer.Option("auto", help="auto | ddlsim | ddlsim-compute | nccl-tests | "
                                               "nccl-tests-json | osu"),
        op: str | None = typer.Option(None, help="operation, when a file does not name it"),
        backend: str | None = typer.Option(None, help="backend label (nccl-tests: nccl; OSU: mpi)"),
        ranks: int | None = typer.Option(None, help="ranks (OSU collectives need it)"),
        nodes: int | None = typer.Option(None, help="nodes (OSU needs it or --scope)"),
        scope: str | None = typer.Option(None, help="intra | inter"),
        max_segments: int = typer.Option(3, help="most α-β segments per curve"),
        min_points: int = typer.Option(3, help="fewest points per segment"),
        bootstrap: int = typer.Option(200, help="bootstrap resamples (0: no intervals)"),
        seed: int = typer.Option(0, help="bootstrap seed"),
        statistic: str = typer.Option("median", help="time fitted per size: median | mean | "
                                                     "min (min resists noise on shared hosts)"),
        compute_statistic: str | None = typer.Option(
            None, help="the compute rows' statistic, when it differs from --statistic"),
        peak: list[str] = typer.Option([], help="dtype=peak, e.g. 'fp32=7.17 TFLOP/s'"),
        system: str | None = typer.Option(None, help="system preset supplying peak FLOP/s"),
        name: str | None = typer.Option(None, help="profile name"),
        max_skipped_share: float = typer.Option(
            DEFAULT_MAX_SKIPPED_SHARE, help="largest share of a file's rows that may be "
            "unusable (each is listed with FILE:LINE and the reason) before the fit refuses"),
        max_rel_rmse: float = typer.Option(
            DEFAULT_MAX_REL_RMSE, help="largest relative RMS error of a fitted curve against "
            "its own points before the fit refuses ('inf': accept any)"),
        force: bool = typer.Option(False, help="overwrite an existing profile"),
        limit: list[str] = typer.Option([], "--limit", help="raise a work budget, e.g. "
                                        "--limit fit_segments=500")) -> None:
    from ..cliutil import refuse_overwriting_inputs
    from ..limits import Limits, check_budget

    limits = Limits.from_strings(limit)
    check_budget({"fit_segments": max_segments}, limits, "--max-segments")
    check_budget({"fit_bootstrap": bootstrap}, limits, "--bootstrap")
    refuse_overwriting_inputs(results, output=output)
    from .build import fit_profile
    from .outputs import guard_output
    from .readers import read_results

    guard_output(output, force)
    if scope is not None:
        _choice(scope, ("intra", "inter"), "--scope")
    read = []
    for path in results:
        got = read_results(path, format, op=op, backend=backend, ranks=ranks, nodes=nodes,
                           scope=scope)
        for row in got.skipped:
            _err.print(escape(str(row)), highlight=False, soft_wrap=True)
        read.append(got)
    profile = fit_profile(read, max_skipped_share=max_skipped_share,
                          max_segments=max_segments, min_points=min_points,
                          bootstrap=bootstrap, seed=seed, peaks=_peaks(peak, system),
                          name=name, statistic=statistic, max_rel_rmse=max_rel_rmse,
                          compute_statistic=compute_statistic)
    profile.save(output, force)
    for c in profile.doc.compute:
        if c.peak_flops_per_s is None:
            _err.print(escape(f"warning: the {c.backend}/{c.device} {c.kind} {c.dtype} compute "
                              "fit has no peak FLOP/s, so `ddlsim predict --calibration` "
                              f"cannot use it; fit again with --peak '{c.dtype}=<peak FLOP/s>' "
                              "or --system PRESET"), highlight=False, soft_wrap=True)
    skipped = sum(len(r.skipped) for r in read)
    note = (f"; {skipped} row(s) skipped, listed above and in provenance.skipped"
            if skipped else "")
    _err.print(escape(f"wrote {output}: {len(profile.doc.comm)} communication and "
                      f"{len(profile.doc.compute)} compute fits from "
                      f"{sum(len(r.table) for r in read)} rows{note}"), soft_wrap=True)


# ---------------------------------------------------------------------------- first-touch
@app.command("first-touch", help="Measure this host's first-touch cost (a page fault and the "
             "kernel zeroing the page, per page a process writes for the first time) and add "
             "it to a profile, whence predict charges it to buffers a program allocates fresh "
             "every iteration (model.recv_buffers: fresh).\n\nExample: ddlsim calibrate "
             "first-touch profile.yaml --bytes 4MiB")
@_friendly
def first_touch(profile: Path = typer.Argument(..., help="profile YAML to add it to"),
                nbytes: str = typer.Option("4MiB", "--bytes", help="bytes per copy"),
                repeats: int = typer.Option(100, help="fresh mappings copied into, all held "
                                            "until the last (mean)"),
                force: bool = typer.Option(False, help="replace the profile's measurement")
                ) -> None:
    from .firsttouch import add_first_touch, measure_first_touch, summary

    size = parse_bytes(nbytes)
    if size != int(size):
        raise CalibrationError(f"--bytes {nbytes!r} is not a whole number of bytes")
    entry = measure_first_touch(int(size), repeats)
    add_first_touch(profile, entry, force)
    _err.print(escape(f"wrote {profile}: {summary(entry)}"), soft_wrap=True)


# ----------------------------------------------------------------------------------- show
@app.command(help="Print a profile as tables; with --plot, save measured points against the "
                  "fitted curves (log-log, one panel per operation).\n\nExample: ddlsim "
                  "calibrate show profile.yaml --plot profile.png")
@_friendly
def show(profile: Path = typer.Argument(..., help="profile YAML"),
         plot: Path | None = typer.Option(None, help="write a plot (PNG, PDF, SVG)"),
         force: bool = typer.Option(False, help="overwrite an existing plot file")) -> None:
    from ..cliutil import refuse_overwriting_inputs
    from .profile import CalibrationProfile
    from .report import comm_table, compute_table, plot_profile

    refuse_overwriting_inputs([profile], plot=plot)
    prof = CalibrationProfile.load(profile)
    console = Console()
    if prof.doc.comm:
        console.print(comm_table(prof))
    if prof.doc.compute:
        console.print(compute_table(prof))
    if prof.doc.first_touch is not None:
        from .firsttouch import summary
        console.print(escape(summary(prof.doc.first_touch)), highlight=False, soft_wrap=True)
    skipped = prof.doc.provenance.get("skipped") or []
    skipped = skipped if isinstance(skipped, list) else [skipped]
    if skipped:
        console.print(escape(f"{len(skipped)} input row(s) were skipped at the fit "
                             "(provenance.skipped):"), highlight=False)
    for row in skipped:
        console.print(escape(_skipped_line(row)), highlight=False, soft_wrap=True)
    if plot is not None:
        _err.print(escape(f"wrote {plot_profile(prof, plot, force)}"))


def _skipped_line(row: object) -> str:
    if not isinstance(row, dict):
        return f"  {row}"
    return f"  {row.get('file')}:{row.get('line')}: {row.get('reason')}"
