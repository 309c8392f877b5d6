"""One backward rule for the decoder's element-wise ops on every layer path: the structured
layer template (ddlsim/workloads/decoder/partition/base.py: context parallelism, 2-D/2.5-D/3-D
tensor parallelism) charges the kernels torch's autograd launches
(simulator/kernels/elementwise_backward.py), as the 1-D builder does, not twice the forward."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import backward_kernels
from ddlsim.workloads.decoder.builder import StageBuilder

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"


def _builder(*sets):
    cfg = ddlsim.load_config(str(EXAMPLE), ["train.seq_length=4096", *sets])
    return StageBuilder.from_config(cfg, cfg.model.shape())


def _ew(ops, name):
    return next(o for o in ops if o.name == name)


@pytest.mark.parametrize("stack", ["torchtitan-2025", "megatron-core-2024"])
def test_the_partition_template_and_the_builder_charge_one_elementwise_backward(stack):
    # 1-D TP 2 without context parallelism: the builder's ops (layer_kernels' bwd.ew) and
    # the partitioner's template (its cp > 1 and 2-D path) build the same layer
    b = _builder(f"system.software={{stack: {stack}}}", "parallel.tensor_model_parallel_size=2",
                 "parallel.data_parallel_size=4",   # ZeRO-1 where the stack shards no more
                 f"parallel.zero_stage={1 if stack == 'megatron-core-2024' else 3}",
                 # torchtitan's TP is always sequence-parallel (tp_needs_sp)
                 f"parallel.sequence_parallel={str(stack.startswith('torchtitan')).lower()}")
    mine = _ew(b.layer_backward(), "bwd.elementwise")
    template = _ew([o.payload for o in b.part.layer_backward(0.0)], "bwd.elementwise")
    assert template.kernels == mine.kernels
    assert template.bytes == mine.bytes
    # and that is not twice the forward's kernels (the old rule)
    fwd = _ew(b.layer_forward(), "fwd.elementwise")
    assert template.kernels != backward_kernels(fwd.kernels)
    assert template.bytes < 2 * fwd.bytes


def test_context_parallel_layers_take_the_same_rule():
    # under CP the template builds every layer: its backward is autograd's kernels over the
    # rank's s/cp tokens, those the builder gives a layer of s/cp tokens without CP
    two = _builder("system.software={stack: torchtitan-2025}", "parallel.context_parallel_size=2",
                   "parallel.data_parallel_size=4")
    half = _builder("system.software={stack: torchtitan-2025}", "train.seq_length=2048")
    got = _ew([o.payload for o in two.part.layer_backward(0.0)], "bwd.elementwise")
    assert got.kernels == _ew(half.layer_backward(), "bwd.elementwise").kernels


def test_context_parallel_layers_reduce_the_repeated_kv_gradients_as_the_builder_does():
    # K/V's repeat: the forward's broadcast copy, the backward's sum over the repeated heads
    # (classes repeat_kv and repeat_kv_backward); the template's CP layer takes the same
    # kernels as the builder's layer of s/cp tokens, both directions
    two = _builder("system.software={stack: torchtitan-2025}", "parallel.context_parallel_size=2",
                   "parallel.data_parallel_size=4")
    half = _builder("system.software={stack: torchtitan-2025}", "train.seq_length=2048")
    got = _ew([o.payload for o in two.part.layer_backward(0.0)], "bwd.repeat_kv")
    assert {k.variant for k in got.kernels} == {"repeat_kv_backward"}
    from ddlsim.workloads.decoder.layerkernels import layer_kernels
    sh, sw = half.shape, half.sw
    want = layer_kernels(sh, sw, 1, 2048, 1, False, "bf16")["bwd.repeat_kv"]
    assert got.kernels == tuple(want)
    fwd = _ew([o.payload for o in two.part.layer_forward(0.0)], "0.0.repeat_kv")
    assert {k.variant for k in fwd.kernels} == {"repeat_kv"}
