"""torchtitan's tensor parallelism as torch runs it: DTensor's layout copies around each
sequence-parallel collective (ddlsim/simulator/kernels/dtensor.py) and torchao's float8
all-gathers under the tensorwise recipe (fp8_gathered.torchao_gathered_passes); bytes by hand
from the sources those modules cite."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels.fp8recipe import fp8_cast_kernels
from ddlsim.workloads.decoder.layerkernels import layer_kernels
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

M, N, K, T = 8192.0, 1280.0, 4096.0, 4
B, S, H = 2, 2048, 4096          # llama-3.1-8b, micro-batch 2


def _passes(backward: bool, compiled: bool = False, **kw) -> list[float]:
    return [k.bytes for k in fp8_cast_kernels("tensorwise", M, N, K, backward, compiled, **kw)]


def test_tensorwise_casts_a_gathered_input_once_on_its_shard():
    # forward: amax (2 B) and cast (2 + 1 B) over M/T rows, the weight's passes unchanged
    assert _passes(False, gathered="x", shards=T) == \
        [2 * M * K / T, 3 * M * K / T, 2 * K * N, 3 * K * N]
    # compiled: the amax read is fused with the norm before it
    assert _passes(False, True, gathered="x", shards=T) == \
        [3 * M * K / T, 2 * K * N, 3 * K * N]
    # backward: the saved gathered FP8 input copied column-major (1 + 1 B over M rows)
    assert _passes(True, gathered="x", shards=T) == _passes(True) + [2 * M * K]


def test_tensorwise_casts_a_gathered_gradient_on_its_shard_then_copies_it_whole():
    assert _passes(True, gathered="g", shards=T) == \
        [2 * M * N / T, 3 * M * N / T, 2 * M * N, 3 * K * N]
    assert _passes(False, gathered="g", shards=T) == _passes(False)


def _cfg(stack: str = "torchtitan-2025", dtype: str = "bf16", recipe: str | None = None,
         compile_: bool = True, async_tp: bool = False, tp: int = 2) -> dict:
    kernels = {"fp8_recipe": recipe} if recipe else {}
    parallel = {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1}
    if stack.startswith("torchtitan"):
        parallel.update(zero_stage=3, data_parallel_size=8 // tp)
    if async_tp:
        parallel["tp_comm_overlap"] = "torch_async"
    return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
            "parallel": parallel,
            "train": {"micro_batch_size": B, "global_batch_size": 2 * 8 // tp,
                      "seq_length": S, "dtype": dtype},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": stack, "compile": compile_,
                                    "kernels": kernels}}}


def _layer(cfg: dict, b: int = B) -> dict:
    c = ddlsim.load_config(cfg)
    t = c.parallel.tensor_model_parallel_size
    return layer_kernels(c.model.shape(), c.software, b, S, t, t > 1, c.train.dtype)


def _tp_collectives(cfg: dict) -> list[Collective]:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o.payload for blk in w.classes[0].program.blocks.values() for o in blk.flat.ops
            if isinstance(o.payload, Collective) and o.payload.group == "tp"]


def _copies(parts: dict, part: str) -> list[float]:
    """The layout copies of ``part``: its memory kernels of one pass over b·s·h (not the
    repeat of K and V to the query heads, ``parts['repeat_kv']``, whose compiled kernel
    moves as many bytes at these shapes)."""
    return [k.bytes for k in _without_repeat_kv(parts, part) if k.kind == "memory"
            and k.bytes in (2 * B * S * H * 2, 2 * B * S * H)]


def _without_repeat_kv(parts: dict, part: str) -> list:
    """``part``'s kernels less those of K/V's repeat, forward copy or backward reduce (by
    identity: :mod:`ddlsim.simulator.kernels.repeat_kv`)."""
    repeats = tuple(parts["repeat_kv"]) + tuple(parts.get("bwd.repeat_kv", ()))
    return [k for k in parts[part] if all(k is not r for r in repeats)]


@pytest.mark.parametrize("stack", ["torchtitan-2024", "torchtitan-2025"])
def test_each_sequence_parallel_collective_copies_its_tensor_eager(stack):
    lk = _layer(_cfg(stack, compile_=False))
    copy = 2 * B * S * H * 2                 # read and write b·s·h bf16
    for part in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "bwd.mlp.fc2",
                 "bwd.attn.proj"):
        assert _copies(lk, part) == [copy], part
    # the backward's re-gather of the input and its input-gradient reduce-scatter
    assert _copies(lk, "bwd.attn.qkv") == [copy, copy]
    assert lk["bwd.attn.qkv"][0].bytes == copy and lk["bwd.attn.qkv"][-1].bytes == copy


def test_compiled_sums_write_the_scattered_layout():
    # the separate projections' gradient sum is one Inductor kernel: no copy before the
    # reduce-scatter; the re-gathered input is still copied
    lk = _layer(_cfg(compile_=True))
    assert _copies(lk, "bwd.attn.qkv") == [2 * B * S * H * 2]
    assert lk["bwd.attn.qkv"][0].bytes == 2 * B * S * H * 2


def test_async_tp_fuses_all_but_the_regather_and_the_weight_gradients_reshape():
    # the fused all-gather returns [s, b, h] seen as [b, s, h]: the bf16 weight gradient's
    # reshape(-1, h) copies the gathered output gradient (the re-gathered input is plain)
    lk = _layer(_cfg(async_tp=True))
    copy = 2 * B * S * H * 2
    for part in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
        assert not _copies(lk, part), part
    for part in ("bwd.mlp.fc2", "bwd.attn.proj"):
        assert _copies(lk, part) == [copy], part
    assert _copies(lk, "bwd.mlp.fc1") == [copy]                # the re-gather's
    # without the re-gather the saved (or recomputed) fused input is copied there instead
    c = ddlsim.load_config(_cfg(async_tp=True))
    lk = layer_kernels(c.model.shape(), c.software, B, S, 2, True, c.train.dtype, False)
    assert _copies(lk, "bwd.mlp.fc1") == [copy] and _copies(lk, "bwd.attn.qkv") == [copy]
    assert not _copies(lk, "attn.qkv")


def test_fp8_weight_gradients_copy_their_operands_anyway():
    # tensorwise: torchao copies the gathered FP8 tensors into _scaled_mm's layouts (xT, gT)
    # in either TP mode; async TP removes the layout copies and adds none
    for regather in (True, False):
        c = ddlsim.load_config(_cfg(dtype="fp8", recipe="tensorwise", async_tp=True))
        on = layer_kernels(c.model.shape(), c.software, B, S, 2, True, c.train.dtype, regather)
        c = ddlsim.load_config(_cfg(dtype="fp8", recipe="tensorwise"))
        off = layer_kernels(c.model.shape(), c.software, B, S, 2, True, c.train.dtype, regather)
        for part in ("bwd.mlp.fc2", "bwd.attn.proj"):
            assert on[part] == off[part][1:], part
        for part in ("bwd.mlp.fc1", "bwd.attn.qkv"):
            assert on[part] == off[part], part


@pytest.mark.parametrize("recipe, gathers_copied", [("tensorwise", False), ("rowwise", True)])
def test_async_tp_keeps_the_copies_of_all_gathers_it_cannot_fuse(recipe, gathers_copied):
    # rowwise: gathered in bf16, cast to FP8 after (no matmul reads the gathered tensor:
    # dtensor.all_gather_fused); the reduce-scatters after a _scaled_mm are fused either way
    off = _layer(_cfg(dtype="fp8", recipe=recipe))
    on = _layer(_cfg(dtype="fp8", recipe=recipe, async_tp=True))
    for part in ("attn.qkv", "mlp.fc1", "bwd.mlp.fc2", "bwd.attn.proj"):
        assert on[part] == (off[part] if gathers_copied else off[part][1:]), part
    copy = 2 * B * S * H * (2 if gathers_copied else 1)        # bf16 or FP8 gathered
    assert off["attn.qkv"][0].bytes == copy
    for part in ("attn.proj", "mlp.fc2"):
        assert on[part] == off[part][:-1] and off[part][-1].bytes == 2 * B * S * H * 2, part


def test_all_gather_fused_only_when_the_gathered_tensor_is_the_gemm_operand():
    from ddlsim.simulator.kernels.dtensor import all_gather_fused
    on = ddlsim.load_config(_cfg(async_tp=True)).software
    off = ddlsim.load_config(_cfg()).software
    assert all_gather_fused(on, False, False) and all_gather_fused(on, True, True)
    assert not all_gather_fused(on, True, False)            # FP8 GEMMs, bf16 gather
    assert not all_gather_fused(off, False, False)


def test_a_local_batch_of_one_still_copies():
    # the view shortcut (pytorch#169404, 2025-12) is newer than both stacks' torch
    lk = _layer(_cfg(compile_=False), b=1)
    assert [k.bytes for k in lk["attn.proj"] if k.kind == "memory"] == [2 * S * H * 2]


@pytest.mark.parametrize("cfg", [_cfg("megatron-core-2025", compile_=False),
                                 _cfg(tp=1)])
def test_no_copies_sequence_first_or_without_tp(cfg):
    base = _layer(cfg)
    assert not [k for k in base["attn.proj"] + base["mlp.fc2"] if k.kind == "memory"]


def test_tensorwise_gathers_and_copies_in_fp8_rowwise_in_bf16():
    act = B * S * H
    wise = _tp_collectives(_cfg(dtype="fp8", recipe="tensorwise"))
    row = _tp_collectives(_cfg(dtype="fp8", recipe="rowwise"))
    bf16 = _tp_collectives(_cfg())
    gathers = [[c.bytes for c in cs if c.op == "all_gather"] for cs in (wise, row, bf16)]
    assert len(gathers[0]) == len(gathers[2]) > 0
    assert set(gathers[0]) == {act} and set(gathers[1]) == set(gathers[2]) == {2 * act}
    # the reduce-scatters stay 16-bit
    assert {c.bytes for c in wise if c.op == "reduce_scatter"} == {2 * act}
    # DTensor reduces the tensorwise amax over TP before each FP8 gather (not the re-gather)
    amax = [c for c in wise if c.op == "all_reduce" and c.name.endswith(".amax")]
    assert len(amax) == sum(c.op == "all_gather" and not c.name.endswith(".ag.input")
                            for c in wise)
    assert not [c for c in row if c.name.endswith(".amax")]
    lk = _layer(_cfg(dtype="fp8", recipe="tensorwise", compile_=False))
    assert lk["attn.qkv"][0].bytes == 2 * act                # FP8: 1 byte an element
    assert lk["bwd.attn.proj"][0].bytes == 2 * act
    assert lk["attn.proj"][-1].bytes == 2 * act * 2          # the reduce-scatter's bf16


def test_prepared_fp8_input_is_cast_once_for_all_projections_eager():
    # PrepareFloat8ModuleInput casts attention's input before the gather; wq, wk, wv take
    # it as it is: one amax and one cast of the shard, eager (per-module casts without TP)
    lk = _layer(_cfg(dtype="fp8", recipe="tensorwise", compile_=False))
    m, q, kv = B * S, 4096 / 2, 1024 / 2          # llama-3.1-8b on 2 TP ranks
    casts = [k.bytes for k in _without_repeat_kv(lk, "attn.qkv")[1:]   # after the copy
             if k.kind == "memory"]
    wq = fp8_cast_kernels("tensorwise", m, q, H, False, gathered="x", shards=2)
    wkv = fp8_cast_kernels("tensorwise", m, kv, H, False, input_cast=False)
    assert casts == [k.bytes for k in wq + wkv + wkv]
    assert [k.bytes for k in wq][:2] == [2 * m * H / 2, 3 * m * H / 2]


@pytest.mark.parametrize("stack, recompute, regathers", [
    ("torchtitan-2025", "none", False), ("torchtitan-2025", "full", False),
    ("torchtitan-2025", "selective", True), ("torchtitan-2024", "none", False),
    ("megatron-core-2025", "none", True), ("megatron-core-2024", "full", True)])
def test_the_backward_gathers_the_input_again_only_where_it_was_not_saved(
        stack, recompute, regathers):
    # autograd saves DTensor's gathered input; op-level selective checkpointing drops the
    # all-gather and Megatron saves the sequence shard: those gather it again (dtensor.py)
    cfg = _cfg(stack, compile_=stack.startswith("torchtitan"))
    cfg["train"]["recompute"] = recompute
    names = [c.name for c in _tp_collectives(cfg)]
    assert any(n.endswith(".ag.input") for n in names) == regathers
    assert sum(n.endswith(".ag") for n in names) > 0


def test_without_the_regather_its_copy_goes_too():
    c = ddlsim.load_config(_cfg(compile_=False))
    lk = layer_kernels(c.model.shape(), c.software, B, S, 2, True, c.train.dtype, False)
    copy = 2 * B * S * H * 2
    # only the input gradient's reduce-scatter copy is left after the QKV backward
    assert _copies(lk, "bwd.attn.qkv") == [copy]
    assert lk["bwd.attn.qkv"][0].bytes != copy and lk["bwd.attn.qkv"][-1].bytes == copy
