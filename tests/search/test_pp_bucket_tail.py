"""The search tier's overlapped gradient buckets on every pipeline stage (issue 27: one
physics). Under a stack whose DDP buckets every stage (torch DDP's ``bucket_cap_mb``:
torchtitan, DeepSpeed; :func:`~ddlsim.workloads.decoder.dpsync.grad_bucket_bytes`), a later
stage's last backward issues its buckets after runs of layers, and each run after the first
loses SMs to the buckets before it (:meth:`~ddlsim.workloads.decoder.dpsync.GradSyncOps.
_segments`); that delays the stage's input-gradient send, and so the first stage's last
backward. Megatron-Core buckets the first stage's first chunk alone (one bucket elsewhere).
On 1F1B plans of PP 2 and 4 with DP 4 and 2 on one node, the search tier's iteration time
equals the exact engine's to rounding, with overlap_grad_reduce on and off (with it on, the
tier was 0.18-0.46 % faster under the bucketing stacks: it charged no later stage's lost SMs)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.run import plan_overrides
from ddlsim.search.spec import Constraints

#: torchtitan's DDP plans (zero_stage 0: torch's replicate) with the fields its FSDP2 and
#: selective recomputation set reset to those the vectorised tier times (they do not act on
#: a DDP plan under full recomputation), and an even pipeline split (the tier's; torchtitan's
#: own, its stacks' default since 2026-11-30, sends a grid to the exact engine)
_TITAN = {"kernels": {"selective_recompute": "attention_core", "pipeline_split": "even"},
          "overlap": {"zero3_reshard_after_forward": "always", "zero3_copy_out": False}}
STACKS = {"torchtitan-2025": _TITAN, "torchtitan-2024": _TITAN, "deepspeed": {},
          "megatron-core-2024": {}}
AXES = {"parallel.pipeline_model_parallel_size": [2, 4],
        "parallel.virtual_pipeline_model_parallel_size": [None],
        "parallel.zero_stage": [0], "train.recompute": ["full"]}


def _base(stack: str, overlap: bool, layers: int) -> dict:
    """llama-3.1-8b cut to ``layers`` layers on one DGX H100, TP 1, full recomputation, four
    micro-batches of one per pipeline (global batch 32 over PP·DP = 8)."""
    sw = STACKS[stack]
    software = {"stack": stack, **sw,
                "overlap": {**sw.get("overlap", {}), "overlap_grad_reduce": overlap}}
    return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": layers},
            "parallel": {"tensor_model_parallel_size": 1, "zero_stage": 0},  # torchtitan: DDP
            "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": software}}


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("stack, layers", [("torchtitan-2025", 8), ("torchtitan-2024", 16),
                                           ("deepspeed", 8), ("megatron-core-2024", 8)])
def test_search_tier_times_every_stage_buckets_as_the_exact_engine(stack, layers, overlap):
    data = _base(stack, overlap, layers)
    frame = evaluate_grid(data, None, [], AXES, Constraints()).frame
    assert frame.attrs["tier"] == "vectorised" and len(frame) == 2
    columns = [c for c in frame.columns if "." in c]
    for i in range(len(frame)):
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        assert cfg.parallel.data_parallel_size > 1
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-9), \
            (stack, cfg.parallel.pipeline_model_parallel_size)


def _last_stage_end(data: dict, pp: int) -> tuple[float, float]:
    """(the search tier's, the exact engine's) end of the last stage's iteration, in seconds,
    of the plan ``data`` at PP ``pp`` (DP 8/PP): the tier's is :func:`iteration_time` with
    the first stage's tail taken away, so the last stage's end decides it."""
    from ddlsim.search.family import vector_family
    from ddlsim.search.pipeline import iteration_time
    from ddlsim.search.plans import VECTOR_FIELDS, enumerate_plans
    parallel = {"pipeline_model_parallel_size": pp, "data_parallel_size": 8 // pp}
    cfg = build_config({**data, "parallel": {**data["parallel"], **parallel}}, [])
    fields = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = cfg.parallel.schedule
    plans = enumerate_plans({}, fields, cfg.system.num_devices)
    family = vector_family(cfg.model.architecture)
    costs = family.costs(family.prepare(cfg), plans, None)
    tier = iteration_time(costs._replace(tail_first=costs.tail_first - 1.0), plans)[0]
    exact = ddlsim.predict(cfg, check_fit=False).per_class_time_s[f"stage{pp - 1}"]
    return float(tier), exact


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("stack", ["torchtitan-2025", "deepspeed", "megatron-core-2024"])
def test_last_stage_buckets_add_what_the_exact_engine_adds(stack, pp):
    """The last stage's overlapped buckets (torch DDP's: every run after the first loses SMs
    to the buckets before it; Megatron-Core's: one bucket after the backward) move the tier's
    end of the last stage as they move the exact engine's: its error is the same with
    overlap_grad_reduce on and off (the closed form's own error of the last stage's drain,
    which does not depend on the buckets, cancels)."""
    on, off = (_last_stage_end(_base(stack, overlap, 8), pp) for overlap in (True, False))
    assert on[0] - on[1] == pytest.approx(off[0] - off[1], abs=1e-9 * on[1])
