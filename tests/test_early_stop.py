"""Where a checkpointed block's recomputation ends (ddlsim/workloads/decoder/early_stop.py):
torch's non-reentrant checkpoint with early stop, or a compiled block, leaves out the down
projection's GEMM, the reduction after it and the last residual add; Megatron's and
DeepSpeed's reentrant checkpoints re-run everything."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.elementwise import residual_bytes
from ddlsim.software import resolve_software, stacks
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.early_stop import trims_tail
from ddlsim.workloads.trace import Collective, Compute

#: Llama 3.1 8B shortened to 4 layers, TP 2 with sequence parallelism, FSDP over the rest
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 4},
        "parallel": {"zero_stage": 3, "tensor_model_parallel_size": 2,
                     "sequence_parallel": True},
        "train": {"micro_batch_size": 2, "global_batch_size": 32, "seq_length": 4096,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 1}}
#: b, s, h, f of BASE and its TP size
B, S, H, F, T = 2, 4096, 4096, 14336, 2


def config(stack="torchtitan-2024", recompute="full", cp=1, what_if=False, **kernels):
    d = copy.deepcopy(BASE)
    d["system"]["software"] = {"stack": stack, "kernels": kernels, "what_if": what_if}
    d["train"]["recompute"] = recompute
    if stack in ("megatron-core-2024", "megatron-lm-2021"):   # rule no_zero3: no sharding
        d["parallel"]["zero_stage"] = 1 if stack == "megatron-core-2024" else 0
    if cp > 1:
        d["parallel"]["context_parallel_size"] = cp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def recomputed(cfg) -> list:
    """The recomputed forward of one dense layer's backward (builder ops ``recompute.*``)."""
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    return [x for x in b.layer_backward() if x.name.startswith("recompute.")]


def gemm_flops(ops) -> float:
    return sum(2 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch for x in ops
               if isinstance(x, Compute) for k in x.kernels or () if k.kind == "gemm")


@pytest.mark.parametrize("stack", stacks())
def test_every_stack_names_its_checkpoint_with_a_source(stack):
    sw = resolve_software(stack)
    assert sw.activation_checkpoint in ("reentrant", "non_reentrant",
                                        "non_reentrant_early_stop")
    assert sw.sources["activation_checkpoint"]
    reentrant = stack.startswith(("megatron", "deepspeed"))
    assert (sw.activation_checkpoint == "reentrant") == reentrant


def test_which_stacks_trim_the_tail():
    """torchtitan 9dec370 runs torch's default (early stop); 07c00d9 turns early stop off
    (job_config early_stop = False) but a compiled block loses the tail anyway; Megatron and
    DeepSpeed never trim, compiled or not."""
    assert trims_tail(resolve_software("torchtitan-2024"))
    assert not trims_tail(resolve_software("torchtitan-2025"))
    assert trims_tail(config("torchtitan-2025", compile=True).software)
    # Megatron-LM 900f1b76 cannot compile the model (rule no_torch_compile): a what-if
    assert not trims_tail(config("megatron-core-2024", compile=True, what_if=True).software)


def test_early_stop_drops_the_down_projection_its_reduce_scatter_and_the_last_add():
    whole = recomputed(config(activation_checkpoint="non_reentrant"))
    trimmed = recomputed(config())
    # w2: [b·s, f/t] · [f/t, h]
    assert gemm_flops(whole) - gemm_flops(trimmed) == pytest.approx(2 * B * S * H * F / T)
    names = [x.name for x in trimmed]
    assert "recompute.mlp.rs" in [x.name for x in whole] and "recompute.mlp.rs" not in names
    # the all-gathers that feed a GEMM stay (the input's gather is saved for the backward)
    assert [x.name for x in whole if isinstance(x, Collective) and x.op == "all_gather"] == \
        [x.name for x in trimmed if isinstance(x, Collective) and x.op == "all_gather"]
    whole_ew = next(x for x in whole if x.name == "recompute.elementwise")
    trimmed_ew = next(x for x in trimmed if x.name == "recompute.elementwise")
    sw = resolve_software("torchtitan-2024")
    add = sum(residual_bytes(config().model.shape(), B * S * H / T, 2, sw))
    assert whole_ew.bytes - trimmed_ew.bytes == pytest.approx(add)


def test_reentrant_stacks_recompute_the_whole_layer():
    cfg = config("megatron-core-2024")
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    assert recomputed(cfg) == b.layer_forward("recompute", False)


def test_trimming_is_faster_and_moves_no_memory():
    whole, trimmed = config(activation_checkpoint="non_reentrant"), config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rw = ddlsim.predict(whole, "analytical", check_fit=False)
        rt = ddlsim.predict(trimmed, "analytical", check_fit=False)
    assert rt.iteration_time_s < rw.iteration_time_s
    assert rt.memory == rw.memory


def test_the_op_level_policy_leaves_out_the_last_add_only():
    whole = recomputed(config(recompute="selective", activation_checkpoint="non_reentrant"))
    trimmed = recomputed(config(recompute="selective"))
    assert gemm_flops(whole) == gemm_flops(trimmed)
    sw = resolve_software("torchtitan-2024")
    add = sum(residual_bytes(config().model.shape(), B * S * H / T, 2, sw))
    assert whole[0].bytes - trimmed[0].bytes == pytest.approx(add)


def test_context_parallel_layers_trim_the_same_tail():
    def layer_ops(cfg):
        b = StageBuilder.from_config(cfg, cfg.model.shape())
        body = b.part.layer_backward(0.0)
        return [o.payload for o in body if o.payload.name.startswith("recompute.")]
    whole = layer_ops(config(activation_checkpoint="non_reentrant", cp=2))
    trimmed = layer_ops(config(cp=2))
    assert gemm_flops(whole) - gemm_flops(trimmed) == pytest.approx(2 * B * S / 2 * H * F / T)
    assert not [x for x in trimmed if x.name.startswith("recompute.fc2")
                and not (isinstance(x, Collective) and x.op == "all_gather")]


def test_a_bad_checkpoint_name_is_refused_with_the_allowed_ones():
    with pytest.raises((ConfigError, ValueError)) as e:
        config(activation_checkpoint="early")
    assert "activation_checkpoint" in str(e.value) and "non_reentrant" in str(e.value)


def test_a_compiled_fp8_op_level_recompute_drops_the_down_projections_gemm():
    """torchao's w2 _scaled_mm is not on the save list, but a compiled block's backward
    needs nothing it computes; eager, its autograd Function saves after it runs."""
    def fp8(**kernels):
        d = copy.deepcopy(BASE)
        d["system"]["software"] = {"stack": "torchtitan-2025", "kernels": kernels}
        d["train"].update(recompute="selective", dtype="fp8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return recomputed(ddlsim.load_config(d))
    eager, compiled = fp8(), fp8(compile=True)
    whole = fp8(compile=True, activation_checkpoint="reentrant")
    assert gemm_flops(whole) - gemm_flops(compiled) == pytest.approx(2 * B * S * H * F / T)
    assert gemm_flops(eager) == gemm_flops(whole)


@pytest.mark.filterwarnings("ignore")
def test_the_search_tier_trims_as_the_exact_engine_does():
    """The search builds its pieces with the family's builder: each plan of a small FSDP2
    grid agrees with ddlsim.predict under both checkpoints, and trims to a faster time."""
    from ddlsim.config import build_config
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    axes = {"parallel.tensor_model_parallel_size": [1, 2], "parallel.data_parallel_size": [4, 8],
            "parallel.sequence_parallel": [False, True], "train.micro_batch_size": [1, 2]}
    times = {}
    for ac in ("non_reentrant_early_stop", "non_reentrant"):
        d = copy.deepcopy(BASE)
        d["parallel"] = {"zero_stage": 3}
        d["system"]["software"] = {"stack": "torchtitan-2024",
                                   "kernels": {"activation_checkpoint": ac}}
        frame = evaluate_grid(d, None, [], axes, Constraints()).frame
        assert len(frame) >= 4
        columns = [c for c in frame.columns if "." in c]
        for i in range(len(frame)):
            key = tuple(str(frame.iloc[i][c]) for c in columns)
            exact = ddlsim.predict(build_config(d, plan_overrides(frame.iloc[i], columns)),
                                   check_fit=False).iteration_time_s
            assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-6)
            times.setdefault(key, {})[ac] = exact
    assert all(t["non_reentrant_early_stop"] < t["non_reentrant"] for t in times.values())
