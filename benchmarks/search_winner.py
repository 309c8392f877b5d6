"""The bundled search's winner, and what each of the default stack's features gives it
(docs/search.md, "How far to trust the winner").

Run:  python benchmarks/search_winner.py [--config PATH] [--markdown] [--breakdown]
      python benchmarks/search_winner.py --walk [--markdown]

Runs ``ddlsim search`` on ``--config`` (default ``examples/search-gpt3-175b-1024.yaml``, its
``search:`` section as written), takes the first-ranked plan and predicts it with the exact
analytical engine: iteration time, MFU and memory per GPU. Then the same plan with one feature
of its software stack switched off at a time (:data:`ABLATIONS`: a ``system.software`` kernel
override or a plan option, each passed as a ``--set`` override; a combination the stack
refuses prints the refusal). Last, the search again with gradient-accumulation fusion off, so
that no plan keeps the fusion's gain, and its winner. ``--breakdown`` also prints where the
winner's time and memory go (:func:`breakdown`).

``--walk`` prints instead the walk of docs/search.md: Korthikanti et al.'s published 175B plan
(TP8 PP8, three virtual stages, SP + selective recomputation on 64 A100s) under the 2022 stack
of ``validate_recompute.py``, then with each of :data:`WALK`'s changes added in turn, then
under the default stack (``megatron-core-2024``) itself; iteration time and MFU (Table 5's
model FLOPs, as ``validate_recompute.py`` counts them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ddlsim  # noqa: E402
from ddlsim.configload import build_config  # noqa: E402
from ddlsim.errors import ConfigError  # noqa: E402
from ddlsim.search.run import load_search, plan_overrides  # noqa: E402

CONFIG = ROOT / "examples" / "search-gpt3-175b-1024.yaml"
GiB = 2**30
#: what is switched off on the winner: a row label -> the software kernels and the plan options
#: it sets (Megatron-Core's names: docs/search.md explains each step)
ABLATIONS = {
    "gradient-accumulation fusion": {"kernels": {"gradient_accumulation_fusion": False}},
    "cuDNN/FlashAttention (Megatron's fused softmax instead)":
        {"kernels": {"attention": "fused_softmax"}},
    "both": {"kernels": {"gradient_accumulation_fusion": False, "attention": "fused_softmax"}},
    "overlapped P2P": {"parallel": {"overlap_p2p_comm": False}},
    "data-parallel overlaps (grad reduce, param gather)":
        {"parallel": {"overlap_grad_reduce": False, "overlap_param_gather": False}},
}
#: the feature whose gain docs/search.md takes away from every plan of the search
UNFUSED = ABLATIONS["gradient-accumulation fusion"]
#: the walk from the 2022 stack to the default one, each step added to the ones before it: a
#: row label -> the train fields, software kernels and software overlaps it sets
WALK = {
    "+ bf16 (fp32 gradients accumulated unfused)": {"train": {"dtype": "bf16"}},
    "+ cuBLAS of CUDA 12": {"kernels": {"gemm_library": "cublas-12"}},
    "+ cuDNN fused attention (for Megatron's fused softmax over stored scores)":
        {"kernels": {"attention": "cudnn"}},
    "+ gradient-accumulation fusion": {"kernels": {"gradient_accumulation_fusion": True}},
    "+ overlapped P2P (interleaved)": {"overlap": {"overlap_p2p_comm": True}},
}
#: the stack the walk ends at
DEFAULT_STACK = "megatron-core-2024"


def software_set(config, kernels: dict) -> list[str]:
    """The ``--set`` override of ``system.software`` that keeps the base config's stack (and
    its overrides) and sets ``kernels`` on it; none when ``kernels`` is empty."""
    if not kernels:
        return []
    data, base_dir, _ = load_search(config)
    software = build_config(data, [], base_dir).system.software
    base = ({"stack": software} if isinstance(software, str)
            else software.model_dump(mode="json", exclude_none=True))
    merged = {**base, "kernels": {**base.get("kernels", {}), **kernels}}
    return [f"system.software={json.dumps(merged)}"]


def change_sets(config, change: dict) -> list[str]:
    """The ``--set`` overrides of one :data:`ABLATIONS` entry."""
    plan = [f"parallel.{k}={json.dumps(v)}" for k, v in change.get("parallel", {}).items()]
    return software_set(config, change.get("kernels", {})) + plan


def winner(config, overrides: list[str] | None = None, axes: dict | None = None):
    """The search's first-ranked plan: ``(its --set overrides, its frame row)``
    (``axes``: another grid than the config's, for a quick check)."""
    frame = ddlsim.search(config, axes=axes, overrides=overrides or []).to_frame()
    columns = [c for c in frame.columns if "." in c]
    return plan_overrides(frame.iloc[0], columns), frame.iloc[0]


def predict_plan(config, sets: list[str]):
    """The exact analytical result of the config under ``sets``, or the refusal's message."""
    data, base_dir, _ = load_search(config)
    try:
        return ddlsim.predict(build_config(data, sets, base_dir), check_fit=False)
    except ConfigError as exc:
        return str(exc)


def ablations(config, sets: list[str], labels=None) -> dict:
    """``{label: result or refusal}``: the winner (``sets``) as it is, under ``"(none)"``,
    then with each of ``labels`` (default every :data:`ABLATIONS` entry) switched off."""
    out = {"(none)": predict_plan(config, sets)}
    for label in ABLATIONS if labels is None else labels:
        out[label] = predict_plan(config, sets + change_sets(config, ABLATIONS[label]))
    return out


def walk(row: dict | None = None) -> dict:
    """``{label: (iteration time in s, MFU)}``: a published plan of ``validate_recompute.py``
    (``row``, default its 175B row with SP and selective recomputation) under its 2022 stack,
    after each :data:`WALK` step (cumulative), and under :data:`DEFAULT_STACK`."""
    import copy

    import validate_recompute as vr
    row = row or next(r for r in vr.rows() if r["model"] == "175B" and r["scheme"] == "present")
    cfg = copy.deepcopy(vr.config(row))
    software, gpus = cfg["system"]["software"], int(row["gpus"])

    def timed(c):
        t = ddlsim.predict(c, check_fit=False).iteration_time_s
        return t, vr.model_flops(row) / t / gpus / vr.PEAK

    out = {"2022 stack (validate_recompute.py's, fp16)": timed(cfg)}
    for label, step in WALK.items():
        cfg["train"].update(step.get("train", {}))
        for part in ("kernels", "overlap"):
            software[part] = {**software.get(part, {}), **step.get(part, {})}
        out[label] = timed(cfg)
    cfg["system"]["software"] = DEFAULT_STACK
    out[f"= {DEFAULT_STACK}"] = timed(cfg)
    return out


def breakdown(config, sets: list[str]) -> list[list[str]]:
    """Rows ``[part, value, share]`` of where the plan's time and memory go: the engine's
    exposed communication per group and bubble (share of the iteration), the first rank's
    compute by kind (``kernel_breakdown.step_breakdown``; share of that compute), and the
    memory parts per GPU."""
    from kernel_breakdown import step_breakdown
    data, base_dir, _ = load_search(config)
    cfg = build_config(data, sets, base_dir)
    r = ddlsim.predict(cfg, check_fit=False)
    t = r.iteration_time_s
    out = [[f"exposed {g} communication", f"{s:.3f} s", f"{100 * s / t:.1f} % of the step"]
           for g, s in r.breakdown.exposed_comm_s.items() if s]
    out.append(["pipeline bubble", f"{r.breakdown.bubble_s:.3f} s",
                f"{100 * r.breakdown.bubble_s / t:.1f} % of the step"])
    kinds, _ = step_breakdown(cfg)
    total = sum(kinds.values())
    out += [[f"compute: {k}", f"{s:.3f} s", f"{100 * s / total:.1f} % of the compute"]
            for k, s in sorted(kinds.items(), key=lambda kv: -kv[1])]
    parts = r.memory.to_dict()
    out += [[f"memory: {k}", f"{parts[k] / GiB:.2f} GiB", ""]
            for k in ("weights", "gradients", "optimizer", "activations", "other", "context",
                      "total")]
    return out


def plan_label(row) -> str:
    """``TP4 PP8×6 DP32 b1, ZeRO-1, SP, recompute none`` for a search frame row."""
    v = row.get("parallel.virtual_pipeline_model_parallel_size")
    pp = f"PP{row['parallel.pipeline_model_parallel_size']}" + (f"×{v}" if v and v > 1 else "")
    sp = ", SP" if row.get("parallel.sequence_parallel") else ""
    return (f"TP{row['parallel.tensor_model_parallel_size']} {pp} "
            f"DP{row['parallel.data_parallel_size']} b{row['train.micro_batch_size']}, "
            f"ZeRO-{row.get('parallel.zero_stage', 0)}{sp}, "
            f"recompute {row.get('train.recompute', 'none')}")


def _cells(result) -> list[str]:
    if isinstance(result, str):
        return [f"refused: {result.splitlines()[0]}", "-", "-"]
    fits = "" if result.memory.fits else " (does not fit: timed as if it did)"
    return [f"{result.iteration_time_s:.2f} s", f"{100 * result.mfu:.1f} %",
            f"{result.memory.total / GiB:.1f} GiB{fits}"]


def _print(head: list[str], lines: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(c) for c in col) for col in zip(head, *lines)]
    for cells in (head, *lines):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    """Print the winner, its ablations and the unfused search's winner; exit status 2 for an
    option it does not take (argparse's message names it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG,
                    help="a run config with a search: section (default: %(default)s)")
    ap.add_argument("--markdown", action="store_true", help="the tables as Markdown")
    ap.add_argument("--breakdown", action="store_true",
                    help="also where the winner's time and memory go")
    ap.add_argument("--walk", action="store_true",
                    help="the published 175B plan from the 2022 stack to the default, instead")
    args = ap.parse_args(argv)
    if args.walk:
        if args.config != CONFIG or args.breakdown:
            ap.error("--walk runs validate_recompute.py's published plan: not with --config "
                     "or --breakdown")
        _print(["step", "iteration", "MFU"],
               [[label, f"{t:.2f} s", f"{100 * m:.1f} %"] for label, (t, m) in walk().items()],
               args.markdown)
        return 0
    if not args.config.is_file():
        ap.error(f"--config {args.config}: no such file")
    sets, row = winner(args.config)
    print(f"winner of `ddlsim search {args.config.name}`: {plan_label(row)}\n")
    rows = ablations(args.config, sets)
    _print(["switched off on the winner", "iteration", "MFU", "memory per GPU"],
           [[label, *_cells(r)] for label, r in rows.items()], args.markdown)
    if args.breakdown:
        print("\nwhere the winner's time and memory go (analytical engine, first rank):")
        _print(["part", "value", "share"], breakdown(args.config, sets), args.markdown)
    unfused = change_sets(args.config, UNFUSED)
    sets, row = winner(args.config, unfused)
    print(f"\nthe search with {unfused[0]} (no plan keeps the fusion's gain):\n"
          f"winner {plan_label(row)}")
    _print(["plan", "iteration", "MFU", "memory per GPU"],
           [[plan_label(row), *_cells(predict_plan(args.config, sets + unfused))]],
           args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
