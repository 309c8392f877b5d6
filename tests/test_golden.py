"""Golden predictions: every example (and a few plan variants) pinned to 1e-9 relative.

A change of any prediction is a failing test here and a visible diff in
``tests/golden/predictions.json``. When the change is intended, regenerate the file with

    python -m pytest tests/test_golden.py --update-golden

and explain the diff (which constant or model moved, and why) in the commit message.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ddlsim

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "predictions.json"
#: (``search-*.yaml`` are plan searches: ``ddlsim search`` reads them, tests/test_search_cli.py)
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml")
                  if not p.name.startswith("search-"))
#: Examples whose DES run takes a few seconds at most.
DES_EXAMPLES = [e for e in EXAMPLES if e.startswith(("wiki-", "gpt2-"))]
#: Plan variants on a small model, so every schedule, ZeRO stage and recompute mode is pinned.
SMALL = "examples/gpt2-2ranks-one-node.yaml"
BASE_VARIANT = {
    "model": "gpt3-1.3b",
    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
    "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048},
    "system": {"preset": "dgx-a100", "nodes": 2},
}
VARIANTS = {
    "1f1b": [],
    # Megatron-Core has no GPipe schedule (rule no_gpipe, since 2026-12-01): pinned as a
    # what-if, numbers unchanged
    "gpipe": ["parallel.schedule=gpipe",
              "system.software={stack: megatron-core-2024, what_if: true}"],
    "interleaved-v2": ["parallel.schedule=interleaved",
                       "parallel.virtual_pipeline_model_parallel_size=2"],
    "sp-selective": ["parallel.sequence_parallel=true", "train.recompute=selective"],
    "full-recompute-mb2": ["train.recompute=full", "train.micro_batch_size=2"],
    "zero1": ["parallel.zero_stage=1"],
    # Megatron-Core has no ZeRO-2 (ddlsim/data/software.yaml rules): pinned as a what-if
    "zero2-no-overlap": ["parallel.zero_stage=2", "parallel.overlap_grad_reduce=false",
                         "system.software={stack: megatron-core-2024, what_if: true}"],
    # nor ZeRO-3 (rule no_zero3): PyTorch FSDP under its kernels, pinned as a what-if
    "zero3-pp1": ["parallel.zero_stage=3", "parallel.pipeline_model_parallel_size=1",
                  "system.software={stack: megatron-core-2024, what_if: true}"],
    # DeepSpeed 2021's per-tensor ZeRO-3: gathers on demand, re-gathers under full recompute;
    # a what-if since 2026-12-01: DeepSpeed v0.3.13 runs ZeRO in fp16 only (rule
    # zero_needs_fp16) and the base trains in bf16 (numbers unchanged)
    "zero3-deepspeed-2021": ["parallel.zero_stage=3", "parallel.pipeline_model_parallel_size=1",
                             "train.recompute=full",
                             "system.software={stack: deepspeed-2021, what_if: true}"],
    "ring-tree": ["parallel.collective_algorithm={all_reduce: tree}"],
    "fp16-rail": ["train.dtype=fp16", "system.network.topology=rail_optimized"],
}
#: A small Llama-3 (GQA 32/8, SwiGLU, RMSNorm, rotary, untied) on one DGX H100, shortened to
#: 8 layers so its DES run is quick.
LLAMA_VARIANT = {
    "model": {"preset": "llama3-8b", "num_hidden_layers": 8},
    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                 "sequence_parallel": True},
    "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
              "recompute": "selective"},
    "system": {"preset": "dgx-h100", "nodes": 1},
}
#: Mixtral 8x7B shortened to 4 layers on two DGX H100 nodes with EP4 (carved out of DP8) and
#: a capacity factor: dispatch/combine all-to-all, expert gradients over edp, ZeRO-1 per group.
MOE_VARIANT = {
    "model": {"preset": "mixtral-8x7b", "num_hidden_layers": 4, "capacity_factor": 1.25},
    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                 "expert_model_parallel_size": 4, "sequence_parallel": True, "zero_stage": 1,
                 "moe": {"token_dispatcher_type": "alltoall"}},   # Megatron's default: allgather
    "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
              "recompute": "selective"},
    "system": {"preset": "dgx-h100", "nodes": 2},
}
#: The keys of ``Result.to_dict()`` that are predictions (not metadata).
PREDICTED = ("iteration_time_s", "samples_per_s", "tokens_per_s", "mfu", "flops_per_device",
             "breakdown", "comm_bytes", "memory_per_device_bytes", "world_size",
             "critical_class", "per_class_time_s", "algorithms")


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def cases() -> dict[str, tuple[object, list[str], str]]:
    """case id → (config source, overrides, engine)."""
    out: dict[str, tuple[object, list[str], str]] = {}
    for e in EXAMPLES:
        out[f"{e}:analytical"] = (ROOT / "examples" / e, [], "analytical")
    for e in DES_EXAMPLES:
        out[f"{e}:des"] = (ROOT / "examples" / e, [], "des")
    for name, sets in VARIANTS.items():
        out[f"variant-{name}:analytical"] = (BASE_VARIANT, sets, "analytical")
    out["variant-1f1b:des"] = (BASE_VARIANT, [], "des")
    out["variant-zero3-deepspeed-2021:des"] = (BASE_VARIANT, VARIANTS["zero3-deepspeed-2021"],
                                               "des")
    for engine in ("analytical", "des"):  # a Llama-style decoder: GQA, SwiGLU, RMSNorm, untied
        out[f"llama-variant:{engine}"] = (LLAMA_VARIANT, [], engine)
        out[f"moe-variant:{engine}"] = (MOE_VARIANT, [], engine)
    return out


def predicted(source, overrides: list[str], engine: str) -> dict:
    """The flattened predictions of one case."""
    cfg = ddlsim.load_config(source, overrides)
    d = ddlsim.predict(cfg, engine).to_dict()
    return _flatten({k: d[k] for k in PREDICTED if k in d})


def mismatches(got: dict, want: dict, rel: float = 1e-9) -> list[str]:
    """Keys whose values differ beyond ``rel`` (numbers) or at all (anything else)."""
    bad = [f"{k}: missing now (was {want[k]!r})" for k in sorted(set(want) - set(got))]
    bad += [f"{k}: new key ({got[k]!r})" for k in sorted(set(got) - set(want))]
    for k in sorted(set(got) & set(want)):
        a, b = got[k], want[k]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
        same = math.isclose(a, b, rel_tol=rel, abs_tol=1e-12) if numeric else a == b
        if not same:
            bad.append(f"{k}: {a!r} != golden {b!r}"
                       + (f" ({a / b - 1:+.3e} relative)" if numeric and b else ""))
    return bad


CASES = cases()


@pytest.fixture(scope="module")
def golden(request):
    if request.config.getoption("--update-golden"):
        data = {cid: predicted(*CASES[cid]) for cid in CASES}
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return json.loads(GOLDEN.read_text())


def test_golden_covers_every_case(golden):
    assert sorted(golden) == sorted(CASES), "regenerate with --update-golden"


@pytest.mark.parametrize("case", sorted(CASES))
def test_prediction_unchanged(case, golden):
    bad = mismatches(predicted(*CASES[case]), golden[case])
    assert not bad, f"{case} changed:\n  " + "\n  ".join(bad[:20])


def test_a_one_percent_change_is_caught(golden):
    """The comparison is not vacuous: 1% more peak FLOP/s moves the pinned numbers."""
    case = "variant-1f1b:analytical"
    src, sets, engine = CASES[case]
    got = predicted(src, sets + ["system.device.peak_flops.bf16=315.12e12"], engine)
    assert got["iteration_time_s"] != golden[case]["iteration_time_s"]
    assert any(k.startswith("iteration_time_s") for k in mismatches(got, golden[case]))
