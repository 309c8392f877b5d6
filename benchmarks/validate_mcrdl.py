"""MCR-DL's three gains (Anthony et al., IPDPS 2023; seed 003): NCCL-only, MPI-only and the
per-operation mix (``predict --calibration P --backend auto``) on the paper's three workloads.

Run:  python benchmarks/validate_mcrdl.py [--profiles DIR] [--only NAME,...] [--markdown]
      [--write-docs]

The claims (the paper's abstract, seed 003): mixing communication backends per operation and
message size raised throughput by 31 % for DeepSpeed-MoE on 256 V100s of Lassen, by 20 % for a
dense Megatron-DeepSpeed model and by 25 % for DLRM on 32 A100s of ThetaGPU. The abstract
does not say against which single backend; the table gives the gain over NCCL-only (the
backend of PyTorch and DeepSpeed) and over the faster single backend.

What is checked needs a backend profile per system: ``DIR/<system>.yaml`` (``lassen``,
``thetagpu``), a ``ddlsim calibrate fit`` profile with ``mpi`` (MVAPICH2-GDR) and ``nccl``
entries at the workloads' communicator shapes, from OSU micro-benchmarks (``-d cuda``) and
nccl-tests. None ships: no published MVAPICH2-GDR or NCCL curve of either system (nor the
paper's own figures) could be read where this was built (benchmarks/data/mcrdl/README.md), so a
workload without its system's profile is reported ``unchecked`` -- never a gain made up.

Each row also gives the preset models' whole-iteration time with
``system.collectives.backend`` ``nccl`` and ``mpi`` (ddlsim's NCCL tuning model vs its α-β MPI
algorithms on the preset links): context, not the claim, since neither is a measured library.

The workloads take from the paper what its abstract states (model family, GPU count, system);
every other setting (batch, sequence, parallel layout, ZeRO stage) is an assumption named in
``ASSUMED`` and printed with the notes. Nothing is fitted to the claimed gains.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import ddlsim
from ddlsim.calibration import CalibrationProfile
from ddlsim.errors import ConfigError, DDLSimWarning

PROFILES = Path(__file__).with_name("data") / "mcrdl"

#: the seed's systems as ddlsim system configs, each field with its source
SYSTEMS = {
    # LLNL Lassen: IBM Power AC922 nodes, 4 x V100-SXM2-16GB per node on NVLink 2, two EDR
    # InfiniBand (100 Gb/s) ports per node, as LLNL's public system page (hpc.llnl.gov,
    # "Lassen") describes it; that page is not in this project's library and was not re-read
    # here. The V100 and NVLink 2 constants are the dgx1-v100 preset's (datasheets), with
    # Lassen's 16 GB device; an AC922's GPUs give part of their NVLink 2 links to the POWER9
    # CPUs, so the preset's GPU-to-GPU bandwidth is an upper bound for Lassen.
    "lassen": {"preset": "dgx1-v100", "devices_per_node": 4, "nics_per_node": 2,
               "device": {"name": "V100-SXM2-16GB", "memory_bytes": "16 GiB"}},
    # ALCF ThetaGPU: 24 NVIDIA DGX A100 nodes, 8 x A100 per node with 320 GB of GPU memory
    # (40 GB A100s), 8 HDR200 compute ports per node, a fat tree of QM9700 HDR switches
    # (argonne-lcf/ThetaGPU-Docs @2628ad8, doc_staging/system_overview_and_node_information.md,
    # Tables 1-2): the dgx-a100 preset with its 40 GB device.
    "thetagpu": {"preset": "dgx-a100",
                 "device": {"name": "A100-SXM4-40GB", "memory_bytes": "40 GiB"}},
}

#: settings the abstract does not give, per workload (printed with the notes)
ASSUMED = {
    "ds-moe": "DeepSpeed-MoE 1.3B+MoE-128 (the preset), EP 128 x DP 256, ZeRO-1, full recompute, "
              "micro-batch 1, seq 2048, fp16: assumed",
    "megatron-ds": "GPT-3 1.3B, DP 32, ZeRO-1, full recompute, micro-batch 4, seq 2048, fp16: assumed",
    "dlrm": "dlrm-proxy tables and MLPs, 32 ranks, global batch 65,536, fp32: assumed",
}


@dataclass(frozen=True)
class Claim:
    """One MCR-DL workload: its claimed throughput gain, system and ddlsim run config."""

    name: str
    gain: float          # claimed throughput gain of the mix, a fraction (0.31 = +31 %)
    system: str          # key of SYSTEMS
    nodes: int
    config: dict         # model, parallel, train (no system)


CLAIMS = (
    Claim("ds-moe", 0.31, "lassen", 64, {
        "model": {"preset": "deepspeed-moe-1.3b-128e"},
        "parallel": {"data_parallel_size": 256, "expert_model_parallel_size": 128,
                     "zero_stage": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 256, "seq_length": 2048,
                  "dtype": "fp16", "recompute": "full"}}),
    Claim("megatron-ds", 0.20, "thetagpu", 4, {
        "model": {"preset": "gpt3-1.3b"},
        "parallel": {"data_parallel_size": 32, "zero_stage": 1},
        "train": {"micro_batch_size": 4, "global_batch_size": 128, "seq_length": 2048,
                  "dtype": "fp16", "recompute": "full"}}),
    Claim("dlrm", 0.25, "thetagpu", 4, {
        "model": {"preset": "dlrm-proxy"},
        "parallel": {"data_parallel_size": 32},
        "train": {"micro_batch_size": 2048, "global_batch_size": 65536, "seq_length": 1,
                  "dtype": "fp32", "optimizer": "sgd"}}),
)


def run_config(claim: Claim, backend: str = "nccl") -> dict:
    """The ddlsim run config of ``claim`` on its system.

    Parameters
    ----------
    claim : the workload.
    backend : ``system.collectives.backend`` (``nccl`` or ``mpi``): the preset model used for
        every collective a profile does not time.

    Returns
    -------
    dict
        A run config (model, parallel, train, system) for :func:`ddlsim.predict`.
    """
    system = {**SYSTEMS[claim.system], "nodes": claim.nodes,
              "collectives": {"backend": backend}}
    if claim.name != "dlrm":
        system["software"] = "deepspeed"
    return {**claim.config, "system": system}


def _predict(config: dict, profile=None, backend: str | None = None):
    """One prediction; warnings of sizes outside the profile are expected and dropped (the
    result lists those collectives as not calibrated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DDLSimWarning)
        return ddlsim.predict(config, calibration=profile, backend=backend)


def uncalibrated(result) -> list[str]:
    """The collectives of ``result`` that its profile did not time (preset model instead)."""
    return sorted(f"{k} ({a})" for k, a in result.algorithms.items() if "(calibrated)" not in a)


def evaluate(claim: Claim, profiles: Path = PROFILES) -> dict:
    """The preset times and, with the system's profile, the three backend choices and gains.

    Parameters
    ----------
    claim : the workload.
    profiles : directory holding ``<system>.yaml`` profiles with ``mpi`` and ``nccl`` entries.

    Returns
    -------
    dict
        ``preset_nccl_s``, ``preset_mpi_s`` (s), ``collectives`` and ``status``; when checked
        also ``nccl_s``, ``mpi_s``, ``auto_s`` (s), ``gain_over_nccl`` and ``gain_over_best``
        (throughput gains t_single / t_auto - 1), ``error_points`` (100 x (gain over NCCL -
        claimed gain)) and ``uncalibrated`` (collectives the profile did not time).

    Raises
    ------
    ConfigError
        If the profile lacks the ``mpi`` or the ``nccl`` backend.
    """
    preset = _predict(run_config(claim, "nccl"))
    out = {"claim": claim, "preset_nccl_s": preset.iteration_time_s,
           "preset_mpi_s": _predict(run_config(claim, "mpi")).iteration_time_s,
           "collectives": sorted(preset.algorithms)}
    path = profiles / f"{claim.system}.yaml"
    if not path.is_file():
        return {**out, "status": f"unchecked: no profile {path.name}"}
    profile = CalibrationProfile.load(path)
    missing = {"mpi", "nccl"} - set(profile.backends)
    if missing:
        raise ConfigError(f"profile {path}: backends {sorted(profile.backends)}; MCR-DL's "
                          f"comparison needs mpi and nccl (missing: {sorted(missing)})")
    cfg = run_config(claim)
    single = {b: _predict(cfg, profile, b).iteration_time_s for b in ("nccl", "mpi")}
    mixed = _predict(cfg, profile, "auto")
    gain_nccl = single["nccl"] / mixed.iteration_time_s - 1
    return {**out, "status": "checked", "nccl_s": single["nccl"], "mpi_s": single["mpi"],
            "auto_s": mixed.iteration_time_s, "gain_over_nccl": gain_nccl,
            "gain_over_best": min(single.values()) / mixed.iteration_time_s - 1,
            "error_points": 100 * (gain_nccl - claim.gain),
            "uncalibrated": uncalibrated(mixed)}


def _ms(x: float) -> str:
    return f"{1e3 * x:.4g}"


def _row(o: dict) -> list[str]:
    c = o["claim"]
    head = [c.name, f"{c.system} ({c.nodes} nodes)", f"+{100 * c.gain:.0f} %",
            _ms(o["preset_nccl_s"]), _ms(o["preset_mpi_s"]),
            f"{100 * (o['preset_nccl_s'] / o['preset_mpi_s'] - 1):+.1f} %"]
    if o["status"] != "checked":
        return head + ["-", "-", "-", "-", "-", o["status"]]
    return head + [_ms(o["nccl_s"]), _ms(o["mpi_s"]), _ms(o["auto_s"]),
                   f"{100 * o['gain_over_nccl']:+.1f} %", f"{100 * o['gain_over_best']:+.1f} %",
                   f"{o['error_points']:+.1f} points"]


HEAD = ["workload", "system", "claimed", "preset nccl ms", "preset mpi ms", "mpi over nccl",
        "profile nccl ms", "profile mpi ms", "auto ms", "auto over nccl", "auto over best",
        "vs claim"]


def table(out: list[dict], markdown: bool = False) -> str:
    """The result table, plain or Markdown."""
    rows = [HEAD] + [_row(o) for o in out]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * len(HEAD))
        return "\n".join(lines)
    return "\n".join("  ".join(r) for r in rows)


def summary(out: list[dict]) -> str:
    """One line: how many claims were checked, and within 10 points."""
    checked = [o for o in out if o["status"] == "checked"]
    within = sum(abs(o["error_points"]) <= 10 for o in checked)
    text = (f"validate_mcrdl: {len(checked)} of {len(out)} MCR-DL gains checked, {within} "
            "within 10 points")
    if checked:
        worst = max(checked, key=lambda o: abs(o["error_points"]))
        text += f" (worst {worst['claim'].name} {worst['error_points']:+.1f} points)"
    partial = sum(bool(o["uncalibrated"]) for o in checked)
    if partial:
        text += f"; {partial} with collectives the profile did not time (notes)"
    if len(checked) < len(out):
        text += "; the rest need published MVAPICH2-GDR/NCCL profiles of their systems"
    return text


def _claims(only: str | None) -> list[Claim]:
    if not only:
        return list(CLAIMS)
    names = {c.name: c for c in CLAIMS}
    bad = [n for n in only.split(",") if n not in names]
    if bad:
        raise ConfigError(f"--only {bad[0]!r} is not a workload; allowed: {', '.join(names)}")
    return [names[n] for n in only.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=PROFILES,
                    help="directory of <system>.yaml backend profiles (default: %(default)s)")
    ap.add_argument("--only", help="comma-separated workloads: " +
                    ", ".join(c.name for c in CLAIMS))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--write-docs", action="store_true",
                    help="replace the validate_mcrdl block of docs/validation.md with the "
                    "Markdown output")
    args = ap.parse_args(argv)
    try:
        if not args.profiles.is_dir():
            raise ConfigError(f"--profiles {str(args.profiles)!r} is not a directory")
        out = [evaluate(c, args.profiles) for c in _claims(args.only)]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = report(out, args.markdown or args.write_docs)
    if args.write_docs:
        from public_runs import write_docs
        write_docs("validate_mcrdl", text)
    print(text)
    return 0


def report(out: list[dict], markdown: bool) -> str:
    """The table, one note per workload (assumptions, collectives, untimed ones), the summary."""
    lines = [table(out, markdown), ""]
    for o in out:
        name = o["claim"].name
        lines.append(f"note: {name}: {ASSUMED[name]}; collectives to measure (group.op[size]): "
                     f"{', '.join(o['collectives'])}")
        if o.get("uncalibrated"):
            lines.append(f"note: {name}: timed by the preset model, not the profile: "
                         + ", ".join(o["uncalibrated"]))
    lines.append(summary(out))
    return ("\n\n" if markdown else "\n").join(lines).replace("\n\n\n\n", "\n\n")


if __name__ == "__main__":
    sys.exit(main())
