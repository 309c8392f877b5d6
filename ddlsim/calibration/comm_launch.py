"""What ``ddlsim calibrate comm`` does on every rank around the benchmark itself
(:mod:`.comm_bench`): open the backend's adapter, agree on the output paths, show progress
on rank 0, and write the CSV with its NAME.meta.yaml (hosts, versions, command line, date)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from rich.console import Console

from .schema import CalibrationError

__all__ = ["progress_bar", "open_adapter", "agree_on_outputs", "write_comm", "library_versions"]


def progress_bar(enabled: bool, total: int):
    """A context whose value advances a rich progress bar of ``total`` steps by one per call
    (with the step's label), on stderr; a context whose value is None when not ``enabled``."""
    from contextlib import nullcontext

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    if not enabled:
        return nullcontext(None)
    bar = Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)

    class _Bar:
        def __enter__(self):
            bar.__enter__()
            task = bar.add_task("starting", total=total)
            return lambda label: bar.update(task, advance=1, description=label)

        def __exit__(self, *exc):
            return bar.__exit__(*exc)
    return _Bar()


def open_adapter(backend: str):
    """This rank's adapter of ``backend``: mpi4py's world, or torch.distributed's process
    group (nccl, gloo) from the launcher's environment."""
    from .adapters import MpiAdapter, TorchAdapter

    return MpiAdapter.world() if backend == "mpi" else TorchAdapter.from_env(backend)


def agree_on_outputs(adapter, output: Path, force: bool) -> None:
    """Rank 0 checks the output paths; every rank raises the same error (no hang)."""
    from .outputs import guard_output, metadata_path

    problem = ""
    if adapter.rank == 0:
        try:
            guard_output(output, force)
            guard_output(metadata_path(output), force)
        except CalibrationError as exc:
            problem = str(exc)
    problem = adapter.allgather_obj(problem)[0]
    if problem:
        raise CalibrationError(problem)


def write_comm(adapter, rows, world, output: Path, force: bool, options: dict) -> Path:
    """On rank 0: the measured ``rows`` as a CSV at ``output``, and beside it NAME.meta.yaml
    (command line, launcher environment, library and versions, hosts, machine, ``options``);
    returns the metadata file's path."""
    from .outputs import machine_info, metadata_path, utc_now, write_csv, write_yaml
    from .schema import tidy_frame

    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):
        argv[0:1] = ["python", "-m", "ddlsim.calibration"]
    launcher = {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE",
                                 "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NTASKS",
                                 "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"))}
    meta = {"created_utc": utc_now(), "command": shlex.join(argv), "launcher_env": launcher,
            "backend": adapter.backend, "library": adapter.library,
            "library_version": adapter.library_version, "ranks": adapter.size,
            "nodes": world.nodes, "ranks_per_node": world.ranks_per_node,
            "hosts": sorted(set(world.hosts)), "rank_hosts": list(world.hosts),
            "versions": library_versions(), "machine": machine_info(), "options": options}
    write_csv(output, tidy_frame(rows), force)
    write_yaml(metadata_path(output), meta, force)
    return metadata_path(output)


def library_versions() -> dict:
    """Versions of numpy and of mpi4py and torch when this process has imported them."""
    import numpy

    out = {"numpy": str(numpy.__version__)}
    for mod in ("mpi4py", "torch"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "?"))
    return out
