"""FSDP2's host time (ddlsim/workloads/decoder/fsdp2_host.py, "Host time of the hooks" and
"The optimizer step over DTensors"): each unit's hooks on the ``host`` stream, in tiny ops of
the device, per unit and per parameter tensor as benchmarks/fsdp2_host_costs.py measured them;
DTensor's host time of a single-tensor optimizer step. Each figure is derived by hand from the
module's constants."""

from __future__ import annotations

import math

import pytest

import ddlsim
from ddlsim.workloads.decoder import fsdp2_host as fp
from ddlsim.workloads.trace import Collective, Compute

US = 1e-6


def _config(dp=1, stack="torchtitan-2025", fused=None, layers=4, zero3=None, preset="dgx-h200"):
    software = {"stack": stack}
    if fused is not None:
        software["kernels"] = {"fused_optimizer": fused}
    if zero3 is not None:
        software["zero3_implementation"] = zero3
    return ddlsim.load_config({
        "model": {"preset": "llama-3.1-8b", "num_hidden_layers": layers},
        "parallel": {"zero_stage": 3, "data_parallel_size": dp},
        "train": {"micro_batch_size": 1, "global_batch_size": dp, "seq_length": 2048,
                  "dtype": "bf16"},
        "system": {"preset": preset, "nodes": 1, "devices_per_node": dp,
                   "software": software}})


def _loop_config(ranks=2):
    """The torch loop's ``torch-fsdp`` run (the ``--small`` model) on a CPU system whose launch
    facts are torch_machine.py's: no host time per op, the dispatch (1.14 µs) as the gap."""
    from ddlsim.reference.loop import SMALL
    from ddlsim.reference.machine import local_system
    from ddlsim.reference.torch_loop import torch_model, torch_run_config
    from ddlsim.reference.torch_machine import TORCH_STACK
    system = local_system(ranks, 1e11, 3e10, (1e-5, 1e9), 8e9, "test")
    system["device"]["launch"] = {"host_launch_s": 0.0, "eager_op_s": 0.0,
                                  "stream_gap_s": 1.14 * US, "graph_gap_s": 1.14 * US,
                                  "source": "test"}
    system["software"] = TORCH_STACK
    return ddlsim.load_config(torch_run_config(torch_model(SMALL), ranks, "torch-fsdp", system))


def _blocks(cfg):
    return ddlsim.build_workload(cfg).classes[0].program.blocks


def _named(ops, name):
    return [(i, o) for i, o in enumerate(ops) if o.payload.name == name]


def test_tiny_op_is_the_launch_facts_or_the_cpu_gap():
    cfg = _config()
    launch = cfg.system.device.launch
    assert fp.tiny_op_s(launch) == pytest.approx(launch.eager_op_s + launch.host_launch_s)
    cpu = launch.model_copy(update={"eager_op_s": 0.0, "host_launch_s": 0.0,
                                    "stream_gap_s": 1.14 * US})
    assert fp.tiny_op_s(cpu) == pytest.approx(1.14 * US)
    assert fp.tiny_op_s(None) == 0.0


def test_parameter_tensors_of_the_loop_model_and_llama():
    from ddlsim.workloads.models.decoder import DecoderShape
    gpt = DecoderShape(layers=2, hidden=384, heads=6, ffn=1536, vocab=4096, max_positions=64)
    # torch_train.py's block: 2 LayerNorms, qkv, proj, fc, fc_proj, weight and bias each
    assert fp.layer_tensors(gpt, separate=False) == 12
    # its root: wte, wpe, ln_f weight and bias (tied head): 2 x 12 + 4 = the loop's 28
    assert fp.edge_tensors(gpt, ".root") == 4
    lla = DecoderShape(layers=2, hidden=4096, heads=32, ffn=14336, vocab=128256, kv_heads=8,
                       gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary",
                       tied_embeddings=False, qkv_bias=False, out_bias=False, mlp_bias=False)
    # torchtitan's block: attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3
    assert fp.layer_tensors(lla, separate=True) == 9
    assert fp.layer_tensors(lla, separate=False) == 6
    assert fp.edge_tensors(lla, ".embedding") == 1 and fp.edge_tensors(lla, ".head") == 2


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("backward", [False, True])
def test_hook_seconds_by_hand(shards, backward):
    cfg = _config()
    launch = cfg.system.device.launch
    tiny = launch.eager_op_s + launch.host_launch_s
    a, b = fp.HOOK_TINY_OPS[shards > 1, backward]
    share = fp.POST_HOOK_SHARE[shards > 1, backward]
    pre = fp.hook_seconds(launch, shards, backward, 9, post=False)
    post = fp.hook_seconds(launch, shards, backward, 9, post=True)
    assert pre + post == pytest.approx((a + 9 * b) * tiny)
    assert post == pytest.approx((a + 9 * b) * tiny * share)
    assert fp.hook_seconds(None, shards, backward, 9, post=False) == 0.0


def test_one_rank_blocks_carry_their_hooks_on_the_host():
    cfg = _config(layers=4)
    launch = cfg.system.device.launch
    blocks = _blocks(cfg)
    fwd = next(b for n, b in blocks.items() if n.startswith("F")).flat.ops
    bwd = next(b for n, b in blocks.items() if n.startswith("B")).flat.ops
    layer = fp.hook_seconds(launch, 1, False, 9, post=False)
    pres = [o for _, o in _named(fwd, "fsdp2.pre_hook")]
    # 4 blocks, the embedding and the [norm, output] units (torchtitan 07c00d9's wrapping)
    assert len(pres) == 6 and all(o.stream == "host" for o in pres)
    assert sorted(o.payload.seconds for o in pres).count(pytest.approx(layer)) == 4
    for i, o in _named(fwd, "zero3.cast"):      # the unit's compute waits for its pre-hook
        assert any(fwd[d].payload.name == "fsdp2.pre_hook" for d in o.deps)
    posts = sorted(o.payload.seconds for _, o in _named(bwd, "fsdp2.post_hook"))
    assert len(posts) == 6
    # post_backward with _chunk_cat's metadata: a block's 218,112,000 gradients in fp32
    block = fp.hook_seconds(launch, 1, True, 9, post=True) + \
        fp.chunk_cat_host_seconds(launch, 218_112_000 * 4)
    assert posts.count(pytest.approx(block)) == 4


def test_sharded_reduce_scatters_follow_the_post_hook():
    cfg = _config(dp=2, layers=2)
    bwd = next(b for n, b in _blocks(cfg).items() if n.startswith("B")).flat.ops
    rs = [(i, o) for i, o in enumerate(bwd) if isinstance(o.payload, Collective)
          and o.payload.op == "reduce_scatter"]
    assert rs
    for _, o in rs:     # post_backward launches the chunk_cat, then issues the reduce-scatter
        (cat,) = o.deps
        assert bwd[cat].payload.name == "zero3.chunk_cat" and bwd[cat].stream == "compute"
        assert any(bwd[d].payload.name == "fsdp2.post_hook" for d in bwd[cat].deps)
    launch = cfg.system.device.launch
    # the chunk_cat packs all of a block's 218,112,000 gradients (fp32) before the reduce-scatter
    layer = fp.hook_seconds(launch, 2, True, 9, post=True) + \
        fp.chunk_cat_host_seconds(launch, 218_112_000 * 4)
    assert any(math.isclose(o.payload.seconds, layer) for _, o in
               _named(bwd, "fsdp2.post_hook"))


def test_no_hooks_under_deepspeed():
    for block in _blocks(_config(stack="deepspeed", dp=2)).values():
        assert not [o for o in block.flat.ops if o.payload.name.startswith("fsdp2.")]


def test_dtensor_step_on_a_cpu_only():
    # torchtitan-2024 asks for foreach (fused_optimizer false), torchtitan-2025 for fused:
    # on a GPU neither pays DTensor per tensor
    for cfg in (_config(layers=4, stack="torchtitan-2024"), _config(layers=4)):
        assert not _named(_blocks(cfg)["update"].flat.ops, "optimizer.dtensor_host")
    cfg = _loop_config()
    ops = _blocks(cfg)["update"].flat.ops
    (i, host), = _named(ops, "optimizer.dtensor_host")
    assert host.stream == "host"
    # the loop's 28 tensors: 2 blocks of 12, wte, wpe, ln_f's weight and bias
    assert host.payload.seconds == pytest.approx(
        28 * fp.STEP_OPS_PER_TENSOR * fp.DTENSOR_OP_TINY_OPS * 1.14 * US)
    (_, step), = _named(ops, "optimizer")
    assert i in step.deps and i - 1 in host.deps     # after the gradients' wait


def test_the_loop_runs_its_hooks_serially(monkeypatch):
    cfg = _loop_config()
    blocks = _blocks(cfg)
    fwd = next(b for n, b in blocks.items() if n.startswith("F")).flat.ops
    pres = _named(fwd, "fsdp2.pre_hook")
    # a CPU device: the hooks run between the unit's kernels, out of swept caches
    a, b = fp.COLD_HOOK_TINY_OPS[True, False]
    block = (a + 12 * b) * 1.14 * US * (1 - fp.POST_HOOK_SHARE[True, False])
    assert sorted(o.payload.seconds for _, o in pres)[-2:] == [pytest.approx(block)] * 2
    # on demand (zero3_prefetch_layers 0): a block's pre-hook follows the unit before it
    for i, o in pres[1:]:
        assert o.deps and fwd[o.deps[0]].stream in ("compute", "host")
    forward_hooks = sum(o.payload.seconds for o in fwd if o.payload.name.startswith("fsdp2."))
    with_hooks = ddlsim.predict(cfg).iteration_time_s
    monkeypatch.setattr(fp, "COLD_HOOK_TINY_OPS",
                        {k: (0.0, 0.0) for k in fp.COLD_HOOK_TINY_OPS})
    # a CPU overlaps nothing of the forward's hooks: each lengthens the step
    assert with_hooks - ddlsim.predict(cfg).iteration_time_s >= forward_hooks * (1 - 1e-9)


def test_the_hooks_lengthen_a_host_bound_step(monkeypatch):
    cfg = _config(layers=4)
    with_hooks = ddlsim.predict(cfg).iteration_time_s
    monkeypatch.setattr(fp, "HOOK_TINY_OPS", {k: (0.0, 0.0) for k in fp.HOOK_TINY_OPS})
    without = ddlsim.predict(cfg).iteration_time_s
    assert with_hooks > without


def test_the_h200_trace_reads_as_the_docstring_says(monkeypatch):
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "fsdp2_host_costs", root / "benchmarks" / "fsdp2_host_costs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = root / "benchmarks" / "data" / "device_h200_2026-11-30"
    got = mod.trace_hooks(str(data / "run5" / "none_s2048" / "llama_step_trace.json.gz"))
    assert got["blocks"] == 8
    assert got["forward"]["s"] == pytest.approx(1.242e-3, abs=1e-6)
    assert got["backward"]["s"] == pytest.approx(3.476e-3, abs=1e-6)
    # the constants at the H200's tiny op, against the trace: within the profiler's spread
    launch = _config().system.device.launch
    fwd = sum(fp.hook_seconds(launch, 1, False, 9, post) for post in (False, True))
    bwd = sum(fp.hook_seconds(launch, 1, True, 9, post) for post in (False, True))
    assert 0.5 < fwd / got["forward"]["s"] < 1.5 and 0.5 < bwd / got["backward"]["s"] < 1.5


@pytest.mark.parametrize("backward, a, b, share", [(False, 225.8, 10.92, 0.08),
                                                   (True, 276.8, 18.68, 0.46)])
def test_sharded_hooks_are_fsdp2s_own_path(backward, a, b, share):
    """The sharded figures of ``benchmarks/fsdp2_host_costs.py --fake 2`` (torch's fake process
    group: no collective runs, so no backend's time is in them; medians of five runs), by hand
    for a Llama block of 9 tensors at the H200's tiny op."""
    launch = _config().system.device.launch
    tiny = launch.eager_op_s + launch.host_launch_s
    pre = fp.hook_seconds(launch, 2, backward, 9, post=False)
    post = fp.hook_seconds(launch, 2, backward, 9, post=True)
    assert pre + post == pytest.approx((a + 9 * b) * tiny, rel=1e-9)
    assert post == pytest.approx((a + 9 * b) * tiny * share, rel=1e-9)
