"""The cosmoflow family: parameters, per-layer FLOPs and memory, the model's halos, the plan
rules, and the two engines on a contention-free case.

Numbers are derived by hand from the layer list (mlcommons/hpc cosmoflow/models/cosmoflow.py:
Conv3D 'same' with conv_size·2^i filters → LeakyReLU → MaxPool3D(2), then dense 128, 64, 4).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.api import build_workload
from ddlsim.cli import app
from ddlsim.commprofile import comm_profile
from ddlsim.errors import ConfigError
from ddlsim.workloads.cosmoflow.build import layer_costs
from ddlsim.workloads.cosmoflow.shapes import halo_widths, parameter_count
from ddlsim.workloads.trace import P2P

TIMINGS = ddlsim.load_config("examples/proxies/cosmoflow.yaml").model.proxy_timings


def _cfg(model=None, parallel=None, train=None, nodes=1, preset="proxy-cosmoflow"):
    return ddlsim.load_config({
        "model": {"preset": preset, "spatial_grid": [2, 2, 1], **(model or {})},
        "parallel": parallel or {"tensor_model_parallel_size": 4, "data_parallel_size": 2},
        "train": train or {"micro_batch_size": 8, "global_batch_size": 16, "seq_length": 1,
                           "dtype": "fp32", "optimizer": "sgd"},
        "system": {"preset": "dgx-a100", "nodes": nodes}})


def test_parameter_counts():
    """Conv i: C_in·k³·C_out + C_out for channels 4-32-64-128-256-512; dense: 32768·128 + 128,
    128·64 + 64, 64·4 + 4 = 4,202,948 (flatten = (128/2^5)³·512 = 32768).
    k = 3 (the proxy): 3,488 + 55,360 + 221,312 + 884,992 + 3,539,456 + 4,202,948 = 8,907,556.
    k = 2 (build_model's default, MLPerf HPC): 1,056 + 16,448 + 65,664 + 262,400 + 1,049,088
    + 4,202,948 = 5,597,604."""
    dense = 32768 * 128 + 128 + 128 * 64 + 64 + 64 * 4 + 4
    assert dense == 4_202_948
    for k, total in ((3, 8_907_556), (2, 5_597_604)):
        chans = [4, 32, 64, 128, 256, 512]
        conv = sum(a * k ** 3 * b + b for a, b in zip(chans, chans[1:]))
        assert conv + dense == total
    assert _cfg().family.presets().keys() >= {"proxy-cosmoflow", "mlperf-hpc-cosmoflow"}
    assert parameter_count(_cfg().model) == 8_907_556
    assert parameter_count(_cfg(preset="mlperf-hpc-cosmoflow").model) == 5_597_604


def test_per_layer_flops_and_the_proxys_compute_ratios():
    """Forward FLOPs of conv i for one sample: 2·(128/2^i)³·C_in·27·C_out: conv0
    2·128³·4·27·32 = 14,495,514,624, conv1 2·64³·32·27·64 = 28,991,029,248, conv2 = conv0,
    conv3 = conv0/2, conv4 = conv0/4; dense0 2·32768·128 = 8,388,608. Backward: twice, but
    conv0 needs no data gradient (once). The proxy's forward usleeps (cosmoflow.cpp:25) are
    in the same ratios 1 : 2 : 1 : 1/2 : 1/4 within 0.1 %. On a 2×2×1 grid each rank does 1/4."""
    rows = {r["layer"]: r for r in layer_costs(_cfg(parallel={"data_parallel_size": 1},
                                                    model={"spatial_grid": [1, 1, 1]},
                                                    train={"micro_batch_size": 1,
                                                           "global_batch_size": 1,
                                                           "seq_length": 1}))}
    c0 = 2 * 128 ** 3 * 4 * 27 * 32
    assert c0 == 14_495_514_624
    assert [rows[f"conv{i}"]["forward_flops"] for i in range(5)] == \
        [c0, 2 * c0, c0, c0 / 2, c0 / 4]
    assert rows["conv0"]["backward_flops"] == c0
    assert rows["conv1"]["backward_flops"] == 4 * c0
    assert rows["dense0"]["forward_flops"] == 2 * 32768 * 128 == 8_388_608
    us = [6567, 13135, 6567, 3283, 1641]
    for i in range(5):
        assert us[i] / us[0] == pytest.approx(rows[f"conv{i}"]["forward_flops"] / c0, rel=1e-3)
    split = {r["layer"]: r for r in layer_costs(_cfg(
        train={"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 1}))}
    assert split["conv1"]["forward_flops"] == 2 * c0 / 4
    assert split["dense0"]["forward_flops"] == 8_388_608 / 4


def test_activation_memory_and_model_states():
    """conv0 on one rank, fp32, one sample: input 128³·4 + output 128³·32 elements =
    2,097,152·36·4 B = 301,989,888 B. On a 2×2×1 grid, with a halo plane on both split sides:
    (66·66·128·4 + 64·64·128·32)·4 B = (2,230,272 + 16,777,216)·4 = 76,029,952 B.
    Weights on the 2×2×1 grid: conv weights replicated, dense split 4 ways:
    (4,704,608 + 4,202,948/4)·4 B = 23,021,380 B; SGD keeps one fp32 momentum per weight."""
    one = _cfg(parallel={"data_parallel_size": 1}, model={"spatial_grid": [1, 1, 1]},
               train={"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 1,
                      "dtype": "fp32"})
    assert layer_costs(one)[0]["activation_bytes"] == 301_989_888
    cfg = _cfg(model={"spatial_grid": [2, 2, 1]},
               train={"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 1,
                      "dtype": "fp32", "optimizer": "sgd"})
    assert layer_costs(cfg)[0]["activation_bytes"] == 76_029_952
    mem = build_workload(cfg).peak_memory
    assert mem.weights == mem.gradients == mem.optimizer == 23_021_380
    assert mem.activations == sum(r["activation_bytes"] for r in layer_costs(cfg))


def _sends(cfg, block, rank=0):
    wl = build_workload(cfg)
    cls = next(c for c in wl.classes if rank in c.ranks)
    return [op.payload for op in cls.program.blocks[block].ops
            if isinstance(op.payload, P2P) and op.payload.kind == "send"]


def test_model_halos_read_the_pooled_input():
    """With the model's defaults on a 2×2×1 grid, micro-batch 8: conv0 exchanges its input's
    halo, 1·64·128·4·8 = 262,144 elements per face; conv i ≥ 1 reads the pooled 128/2^i cube
    of 32·2^(i-1) channels: conv1's x-face is 32·64·32·8 = 524,288, a quarter of the proxy's
    2,097,152 (which exchanges the unpooled previous output, cosmoflow.cpp:33). The backward
    halos are the proxy's (cosmoflow.cpp:36), sent before the layer's backward."""
    cfg = _cfg(model={"spatial_grid": [2, 2, 1]})
    fwd = [p.bytes / 4 for p in _sends(cfg, "F")]
    assert fwd == [n for n in (262144, 524288, 262144, 131072, 65536) for _ in "xy"]
    bwd = [p.bytes / 4 for p in _sends(cfg, "B_sync")]
    assert bwd == [n for n in (131072, 262144, 524288, 1048576) for _ in "xy"]


def test_even_kernel_halo_is_one_sided():
    """Kernel 2 with 'same' padding pads 0 planes before and 1 after (TensorFlow), so on a
    2×1×1 grid rank 0 only receives in the forward (1 plane from x1) and only sends in the
    backward (the data gradient's mirror)."""
    assert halo_widths(2) == (0, 1) and halo_widths(3) == (1, 1)
    cfg = _cfg(preset="mlperf-hpc-cosmoflow", model={"spatial_grid": [2, 1, 1]},
               parallel={"tensor_model_parallel_size": 2, "data_parallel_size": 2})
    assert _sends(cfg, "F", rank=0) == [] and len(_sends(cfg, "B_sync", rank=0)) == 4
    assert len(_sends(cfg, "F", rank=1)) == 5 and _sends(cfg, "B_sync", rank=1) == []


def test_micro_batches_repeat_halos_but_reduce_gradients_once():
    """Two micro-batches: twice the halo traffic, one gradient all-reduce per layer."""
    base = {"micro_batch_size": 4, "seq_length": 1, "dtype": "fp32"}
    one = comm_profile(build_workload(_cfg(train={**base, "global_batch_size": 8})), "rank")
    two = comm_profile(build_workload(_cfg(train={**base, "global_batch_size": 16})), "rank")
    key = ["rank", "op", "group"]
    a, b = one.set_index(key), two.set_index(key)
    assert (b.loc[(0, "isend", "sx"), "calls"] == 2 * a.loc[(0, "isend", "sx"), "calls"])
    assert (b.loc[(0, "iallreduce", "world")] == a.loc[(0, "iallreduce", "world")]).all()


def test_halo_overlap_hides_halos_and_keeps_the_work():
    """Overlapping the halo with the interior compute can only shorten the iteration; the
    FLOPs are the same."""
    plain = ddlsim.predict(_cfg(model={"spatial_grid": [4, 1, 1]}), "analytical")
    over = ddlsim.predict(_cfg(model={"spatial_grid": [4, 1, 1], "halo_overlap": True}),
                          "analytical")
    assert over.iteration_time_s < plain.iteration_time_s
    assert over.breakdown.exposed_comm_s["tp"] < plain.breakdown.exposed_comm_s["tp"]
    assert over.hardware_flops == pytest.approx(plain.hardware_flops, rel=1e-12)


@pytest.mark.parametrize("case", ["proxy-2x1x1", "model-data-parallel"])
def test_des_and_analytical_agree_without_contention(case):
    """One neighbour per rank (a 2×1×1 grid) with the proxy's ms-long layers, so halos and
    all-reduces never share a link at the same time; and plain data parallelism."""
    if case == "proxy-2x1x1":
        cfg = _cfg(model={"spatial_grid": [2, 1, 1], "compute": "proxy",
                          "proxy_timings": TIMINGS, "forward_halo": "previous_output",
                          "input_halo": "loaded", "backward_halo": "after_compute"},
                   parallel={"tensor_model_parallel_size": 2, "data_parallel_size": 2})
    else:
        cfg = _cfg(model={"spatial_grid": [1, 1, 1]},
                   parallel={"tensor_model_parallel_size": 1, "data_parallel_size": 4},
                   train={"micro_batch_size": 2, "global_batch_size": 8, "seq_length": 1})
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)
    assert d.breakdown.compute_s == pytest.approx(a.breakdown.compute_s, rel=1e-9)
    assert d.comm_bytes == pytest.approx(a.comm_bytes)


@pytest.mark.parametrize("model,parallel,words", [
    ({"spatial_grid": [3, 1, 1]}, {"tensor_model_parallel_size": 3},
     ["spatial_grid = [3, 1, 1]", "conv0", "128 / 3", "pool_size = 2"]),
    ({"spatial_grid": [16, 1, 1]}, {"tensor_model_parallel_size": 16},
     ["conv3", "16 / 16", "divisible by pool_size"]),
    ({"spatial_grid": [2, 2, 1]}, {"tensor_model_parallel_size": 2},
     ["spatial_grid = [2, 2, 1]", "4 ranks", "tensor_model_parallel_size = 2",
      "or leave it out"]),
    ({"spatial_grid": [2, 2, 2]}, {"tensor_model_parallel_size": 8},
     ["dense2 has 4 outputs", "8 ranks"]),
    ({"spatial_grid": [1, 1, 1]}, {"pipeline_model_parallel_size": 2},
     ["pipeline_model_parallel_size = 2"]),
    ({"proxy_timings": {"optimizer": "0 us"}}, {"tensor_model_parallel_size": 1},
     ["proxy_timings is given but compute = 'model'"]),
    ({"compute": "proxy", "proxy_timings": {k: v for k, v in TIMINGS.items()
                                            if k != "backward.conv1"}},
     {"tensor_model_parallel_size": 1}, ["lacks backward.conv1"]),
    ({"compute": "proxy", "proxy_timings": {**TIMINGS, "forward.conv9": 1.0}},
     {"tensor_model_parallel_size": 1}, ["unknown key 'forward.conv9'"]),
    ({"halo_overlap": True, "backward_halo": "after_compute"},
     {"tensor_model_parallel_size": 1}, ["halo_overlap = true needs backward_halo"]),
    ({"input_shape": [100, 128, 128, 4]}, {"tensor_model_parallel_size": 1},
     ["input_shape = [100, 128, 128, 4]", "divisible by pool_size^n_conv_layers"]),
])
def test_bad_plans_are_one_paragraph_errors(model, parallel, words):
    with pytest.raises(ConfigError) as err:
        _cfg(model=model, parallel=parallel, nodes=2)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("grid, ranks", [([1, 1, 1], 1), ([2, 1, 1], 2), ([2, 2, 1], 4)])
def test_the_spatial_group_size_follows_the_grid_when_the_plan_leaves_it_out(grid, ranks):
    """The spatial group is the mesh's tensor-parallel axis: unset, its size is the grid's;
    given, it must agree (above). The plan line names the grid and the ranks it makes."""
    cfg = _cfg(model={"spatial_grid": grid}, parallel={"data_parallel_size": 2})
    assert cfg.parallel.tp == ranks and cfg.world_size == 2 * ranks
    explicit = _cfg(model={"spatial_grid": grid},
                    parallel={"tensor_model_parallel_size": ranks, "data_parallel_size": 2})
    assert ddlsim.predict(cfg).iteration_time_s == ddlsim.predict(explicit).iteration_time_s
    assert f"spatial grid {'×'.join(map(str, grid))} × DP2 = {2 * ranks} ranks" in \
        cfg.family.plan_summary(cfg)


def test_cli_refuses_a_bad_grid_with_exit_status_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {preset: proxy-cosmoflow, spatial_grid: [3, 1, 1]}\n"
                    "parallel: {tensor_model_parallel_size: 3}\n"
                    "train: {micro_batch_size: 1, global_batch_size: 2, seq_length: 1}\n"
                    "system: {preset: dgx-a100, nodes: 1}\n")
    out = CliRunner().invoke(app, ["predict", str(path)])
    assert out.exit_code == 2
    assert out.output.startswith("error:") and "spatial_grid" in out.output


def test_two_level_conv_gradient_reduction():
    """spatial_then_data: conv i's params_i·4 bytes are all-reduced over the 4-rank spatial
    group, then over the 2 replicas, instead of once over all 8 ranks; 5 conv layers each."""
    conv = 4 * (3488 + 55360 + 221312 + 884992 + 3539456)
    prof = comm_profile(build_workload(_cfg(model={"conv_grad_allreduce": "spatial_then_data"})),
                        "rank")
    rows = prof[(prof["rank"] == 0) & (prof["op"] == "iallreduce")].set_index("group")
    assert rows.loc["sp", ["group_size", "calls", "send_bytes"]].tolist() == [4, 5, conv]
    assert rows.loc["dp", "calls"] == 6     # 5 conv layers + the dense gradients
    assert rows.loc["dp", "send_bytes"] == conv + 4 * 4_202_948 / 4
    assert "world" not in rows.index
