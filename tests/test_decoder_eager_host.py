"""The host time of an eager torchtitan decoder block per layer op
(ddlsim/workloads/decoder/eager_host.py) and of FSDP2's ``_chunk_cat`` metadata
(fsdp2_host.chunk_cat_host_seconds), with the host running ahead of a GPU: figures by hand
from the module constants, the constants against the H200 traces they were read from
(benchmarks/decoder_host_trace.py), and where the host's work lands in the trace."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

import ddlsim
from ddlsim.workloads.decoder import eager_host as eh
from ddlsim.workloads.decoder import fsdp2_host as fp
from ddlsim.workloads.decoder import sac

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "device_h200_2026-11-30"
#: a Llama 3.1 8B block's parameters (wq, wo 4096², wk, wv 4096·1024, w1, w2, w3 4096·14336,
#: two norms of 4096)
BLOCK = 2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096


def _config(seq=2048, layers=4, compile=False, stack="torchtitan-2025", preset="dgx-h200",
            dp=1):
    software = {"stack": stack, "kernels": {"host_dispatch": "eager"}}
    if compile:
        software = {"stack": stack, "compile": True}
    return ddlsim.load_config({
        "model": {"preset": "llama-3.1-8b", "num_hidden_layers": layers},
        "parallel": {"zero_stage": 3, "data_parallel_size": dp},
        "train": {"micro_batch_size": 1, "global_batch_size": dp, "seq_length": seq,
                  "dtype": "bf16"},
        "system": {"preset": preset, "nodes": 1, "devices_per_node": dp,
                   "software": software}})


def _blocks(cfg):
    return ddlsim.build_workload(cfg).classes[0].program.blocks


def _pass(cfg, first: str):
    return next(b for n, b in _blocks(cfg).items() if n.startswith(first)).flat.ops


def _bench():
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "decoder_host_trace", ROOT / "benchmarks" / "decoder_host_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_units_are_the_traces():
    table = _bench().kind_table(DATA / "run5" / "none_s2048" / "llama_step_trace.json.gz")
    assert table["unit_us"] == pytest.approx(17.58, abs=0.01)
    assert {k: round(v["units"], 2) for k, v in table["rows"].items()} == eh.HOST_UNITS


def test_chunk_cat_figure_is_the_traces_median_block():
    bench = _bench()
    blocks = [h for run in ("run1/llama", "run4/llama_s2048", "run5/none_s2048",
                            "run5/full_s2048")
              for h, _ in bench.chunk_cat(DATA / run / "llama_step_trace.json.gz")[:-1]]
    assert len(blocks) == 32       # 8 blocks a trace; the root unit's last, left out
    per_block = statistics.median(blocks) * 1e-6 / (BLOCK * 4 / fp.CHUNK_CAT_BLOCK_BYTES)
    launch = _config().system.device.launch
    tiny = launch.eager_op_s + launch.host_launch_s
    assert per_block / tiny == pytest.approx(fp.CHUNK_CAT_HOST_TINY_OPS, rel=2e-3)


def test_chunk_cat_host_by_hand():
    launch = _config().system.device.launch
    tiny = launch.eager_op_s + launch.host_launch_s
    # one 2 KiB block of fp32 output a metadata entry: 425,990 for a block, 1.84 ms on the H200
    got = fp.chunk_cat_host_seconds(launch, BLOCK * 4)
    assert got == pytest.approx(BLOCK * 4 / 2048 * fp.CHUNK_CAT_HOST_TINY_OPS * tiny)
    assert 1.7e-3 < got < 2.0e-3
    cpu = launch.model_copy(update={"eager_op_s": 0.0, "host_launch_s": 0.0})
    assert fp.chunk_cat_host_seconds(cpu, BLOCK * 4) == 0.0      # the composite path
    assert fp.chunk_cat_host_seconds(None, BLOCK * 4) == 0.0


def test_each_layer_op_waits_for_its_host_op():
    cfg = _config()
    launch = cfg.system.device.launch
    h = launch.eager_op_s + launch.host_launch_s
    for first, pss in (("F", "fwd"), ("B", "bwd")):
        ops = _pass(cfg, first)
        for kind in ("attn", "mlp", "elementwise"):
            idx = [i for i, o in enumerate(ops) if o.payload.name == f"{pss}.{kind}"]
            assert len(idx) == 4                          # one a layer
            for i in idx:
                (host,) = [d for d in ops[i].deps if ops[d].stream == "host"]
                assert ops[host].payload.name == f"{pss}.{kind}.host"
                assert ops[host].payload.seconds == pytest.approx(eh.HOST_UNITS[pss, kind] * h)
                assert not ops[host].deps            # the host waits for nothing of the device


def test_recomputation_takes_the_forwards_units():
    data = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
            "parallel": {"zero_stage": 3, "data_parallel_size": 1},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048,
                      "dtype": "bf16", "recompute": "full"},
            "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 1,
                       "software": {"stack": "torchtitan-2025",
                                    "kernels": {"host_dispatch": "eager"}}}}
    cfg = ddlsim.load_config(data)
    h = cfg.system.device.launch.eager_op_s + cfg.system.device.launch.host_launch_s
    ops = _pass(cfg, "B")
    hosts = [o for o in ops if o.payload.name == "recompute.attn.host"]
    assert len(hosts) == 2 and all(o.payload.seconds == pytest.approx(
        eh.HOST_UNITS["fwd", "attn"] * h) for o in hosts)


@pytest.mark.parametrize("case", ["compiled", "deepspeed", "cpu"])
def test_no_op_host_where_the_measurement_does_not_carry(case):
    if case == "compiled":
        cfg = _config(compile=True)
    elif case == "deepspeed":
        cfg = _config(stack="deepspeed", dp=2)
    else:
        cfg = _config()
        launch = cfg.system.device.launch.model_copy(
            update={"eager_op_s": 0.0, "host_launch_s": 0.0})
        assert eh.unit_s(launch, "eager", "torch_fsdp2") == 0.0
        return
    for block in _blocks(cfg).values():
        assert not [o for o in block.flat.ops if o.payload.name.endswith(
            (".attn.host", ".mlp.host", ".elementwise.host"))]


def test_the_post_hook_follows_the_host_not_the_device():
    ops = _pass(_config(), "B")
    for i, o in enumerate(ops):
        if o.payload.name == "fsdp2.post_hook":
            assert all(ops[d].stream == "host" for d in o.deps)
        if o.payload.name == "zero3.chunk_cat":     # launched by post_backward
            assert any(ops[d].payload.name == "fsdp2.post_hook" for d in o.deps)


def test_a_short_sequence_is_host_bound_a_long_one_is_not(monkeypatch):
    short, long = _config(seq=2048), _config(seq=8192)
    with_host = [ddlsim.predict(c, check_fit=False).iteration_time_s for c in (short, long)]
    monkeypatch.setattr(eh, "HOST_UNITS", {})
    monkeypatch.setattr(fp, "CHUNK_CAT_HOST_TINY_OPS", 0.0)
    without = [ddlsim.predict(c, check_fit=False).iteration_time_s for c in (short, long)]
    # 2,048 tokens: a block's backward on the host (hooks, ops, chunk_cat metadata) outlasts
    # its kernels, and the last unit's metadata is exposed (4 layers: +3.8 %)
    assert with_host[0] > without[0] * 1.03
    # 8,192: the host's lead hides it but for the first unit's ops, before the device has
    # anything to run (1.2 ms of 193: < 1 %)
    assert without[1] < with_host[1] < without[1] * 1.01


def test_a_sac_recompute_re_runs_the_forwards_units():
    # op-level SAC's recompute runs every forward op of the block again through the policy's
    # mode: the selective_op trace's backward (run4/llama_s2048) holds, beyond the plain
    # trace's, the policy (90 × 16.3 µs, sac.py) and about the forward's units again
    bench = _bench()
    plain = bench.kind_table(DATA / "run5" / "none_s2048" / "llama_step_trace.json.gz")
    op_level = bench.kind_table(DATA / "run4" / "llama_s2048" / "llama_step_trace.json.gz")

    def units(table, pss):
        return sum(c["units"] for (p, _), c in table["rows"].items() if p == pss)
    unit_s = op_level["unit_us"] * 1e-6                          # 14.0 µs
    policy = sac.RECOMPUTE_OPS * sac.RECOMPUTE_OP_S / unit_s     # 104.8 units
    rest = units(op_level, "bwd") - units(plain, "bwd") - policy  # 397.7 - 173.2 - 104.8
    forward = sum(eh.HOST_UNITS["fwd", k] for k in eh.SPANS["sac"])
    assert rest == pytest.approx(forward, rel=0.1)               # 119.7 against 110.6
    assert eh.block_host_s("recompute.sac", 1.0) == pytest.approx(forward)
    # and its forward holds the plain forward's units and the policy's (sac.FORWARD_OPS ×
    # FORWARD_OP_S, 164.1 units): 261.0 - 110.6 = 150.4
    assert units(op_level, "fwd") - units(plain, "fwd") == pytest.approx(
        sac.FORWARD_OPS * sac.FORWARD_OP_S / unit_s, rel=0.1)
