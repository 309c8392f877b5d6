"""The host time of Megatron-Core's Transformer Engine linear modules in eager dense layers
(ddlsim/workloads/decoder/te_host.py): the figures by hand from NVIDIA/TransformerEngine
PR #1191 (140 µs a module's forward before it, 115 µs after), which layer ops carry them as
host work of their own, where nothing is charged, and a step whose layer ops the host binds
against one whose kernels outlast it, both engines alike."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder import moe_host
from ddlsim.workloads.decoder import te_host as th
from ddlsim.workloads.trace import Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

LAYERS = 8
MICRO = 4


def _config(stack="megatron-core-2024", preset="gpt2-124m", seq=512, dispatch=None,
            recompute=None, layers=LAYERS):
    software: dict = {"stack": stack}
    if dispatch is not None:
        software["kernels"] = {"host_dispatch": dispatch}
    train = {"micro_batch_size": 1, "global_batch_size": MICRO, "seq_length": seq,
             "dtype": "bf16"}
    if recompute is not None:
        train["recompute"] = recompute
    return ddlsim.load_config({
        "model": {"preset": preset, "num_hidden_layers": layers},
        "parallel": {"data_parallel_size": 1},
        "train": train,
        "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 1,
                   "software": software}})


def _layer_ops(cfg, first: str) -> dict:
    """The layer ops (name → payload) of the first block whose name starts with ``first``."""
    blocks = ddlsim.build_workload(cfg).classes[0].program.blocks
    block = next(b for n, b in blocks.items() if n.startswith(first))
    return {o.payload.name: o.payload for o in block.flat.ops
            if isinstance(o.payload, Compute)}


def _predict(cfg, engine="analytical") -> float:
    return ddlsim.predict(cfg, engine=engine, check_fit=False).iteration_time_s


def test_figures_are_pr_1191s():
    # PR #1191: TEColumnParallelLinear, BF16, TP 1: 140 us per forward before, 115 us after
    assert th.TE_LINEAR_HOST_BEFORE_1191_S == 140e-6
    assert th.TE_LINEAR_HOST_S == moe_host.TE_LINEAR_HOST_S == 115e-6
    before, after = th.STACK_TE["megatron-core-2024"], th.STACK_TE["megatron-core-2025"]
    assert (before.version, after.version) == ("1.8.0.dev0", "2.5.0.dev0")
    # qkv + proj in the attention op, fc1 + fc2 in the MLP op
    assert th.module_host_s("fwd.attn", before) == pytest.approx(2 * 140e-6)
    assert th.module_host_s("fwd.mlp", after) == pytest.approx(2 * 115e-6)
    assert th.module_host_s("recompute.mlp", before) == pytest.approx(2 * 140e-6)
    for name in ("bwd.attn", "bwd.mlp", "fwd.elementwise", "recompute.core"):
        assert th.module_host_s(name, before) is None


def test_a_bad_figure_is_refused():
    with pytest.raises(ValueError, match="linear_host_s must be > 0 s, got -1"):
        th.TEVersion("x", -1.0, "nowhere")


def test_forward_layer_ops_carry_their_modules_host_time():
    ops = _layer_ops(_config(), "F")
    assert ops["fwd.attn"].host_s == pytest.approx(2 * 140e-6)     # qkv, proj
    assert ops["fwd.mlp"].host_s == pytest.approx(2 * 140e-6)      # fc1, fc2
    assert ops["fwd.elementwise"].host_s == 0.0
    newer = _layer_ops(_config(stack="megatron-core-2025"), "F")
    assert newer["fwd.attn"].host_s == pytest.approx(2 * 115e-6)


def test_the_backward_is_not_charged_but_a_full_recompute_is():
    plain = _layer_ops(_config(), "B")
    assert all(p.host_s == 0.0 for p in plain.values())
    full = _layer_ops(_config(recompute="full"), "B")
    assert full["recompute.attn"].host_s == pytest.approx(2 * 140e-6)
    assert full["recompute.mlp"].host_s == pytest.approx(2 * 140e-6)
    assert full["bwd.attn"].host_s == full["bwd.mlp"].host_s == 0.0


@pytest.mark.parametrize("kw", [dict(stack="megatron-lm-2021"), dict(dispatch="cuda_graphs"),
                                dict(stack="torchtitan-2025")])
def test_nothing_where_no_te_module_runs_in_python(kw):
    ops = _layer_ops(_config(**kw), "F")
    assert ops["fwd.attn"].host_s == ops["fwd.mlp"].host_s == 0.0


def test_moe_layers_keep_their_own_chain():
    cfg = ddlsim.load_config({
        "model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
        "parallel": {"data_parallel_size": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 512,
                  "dtype": "bf16"},
        "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 1,
                   "software": {"stack": "megatron-core-2024"}}})
    blocks = ddlsim.build_workload(cfg).classes[0].program.blocks
    charged = {o.payload.name for b in blocks.values() for o in b.flat.ops
               if isinstance(o.payload, Compute) and o.payload.host_s > 0}
    assert not charged


def test_a_small_layer_is_host_bound_a_large_one_is_not(monkeypatch):
    small = _config()
    large = _config(preset="llama-3.1-8b", seq=4096, layers=2)
    with_host = [(_predict(c), _predict(c, "des")) for c in (small, large)]
    monkeypatch.setattr(th, "STACK_TE", {})
    without = [_predict(c) for c in (small, large)]
    for a, d in with_host:           # both engines time the ops' host work alike
        assert a == pytest.approx(d, rel=1e-9)
    # GPT-2 small at 512 tokens: each forward layer op's kernels take well under its two
    # modules' 280 us, so every micro-batch's forward holds at least 2L such ops
    floor = MICRO * 2 * LAYERS * 2 * 140e-6
    assert with_host[0][0] >= floor
    assert with_host[0][0] > without[0] + 0.5 * floor
    # Llama 3.1 8B at 4,096 tokens: every layer op's kernels outlast its modules' 280 us
    assert with_host[1][0] == pytest.approx(without[1], rel=1e-12)
