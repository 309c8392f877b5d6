"""The reference workloads (ddlsim/reference) and the closed loop calibrate → predict → run.

* the numpy GPT-2's backward is the gradient of its forward (central differences);
* it is the model ddlsim describes: the same parameter count as ``ddlsim predict``;
* each of the wiki's four updates, run under ``mpirun -n 2``, leaves every rank with the
  parameters of serial training on the average gradient of both ranks' batches;
* the trainer refuses what it does not run, and more ranks than cores, naming why;
* the loop itself, small (1-2 ranks, the four updates, calibration samples and runs taking
  turns, timed in CPU time): ddlsim's prediction after calibrating this machine is within
  :data:`BOUND` of the measured iteration time, on a busy machine too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import ddlsim
from ddlsim.reference.gpt2 import GPT2, Adam, GPTShape
from ddlsim.reference.interleaved import measured_parts, measured_s
from ddlsim.reference.loop import (COMM_FACTOR, SMALL, STRATEGY_NAMES, comm_ops, comm_sizes,
                                   mpirun, run_loop, summary_line)
from ddlsim.reference.mpijobs import cpu_cores, mpi_env
from ddlsim.reference.train import check_plan

try:
    MPIRUN = mpirun(2)
    import mpi4py  # noqa: F401
except (FileNotFoundError, ImportError):
    MPIRUN = None
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpi4py or mpirun is not installed "
                                                      "(pip install 'ddlsim[mpi]')")

#: (least, most) of predicted / measured − 1 allowed in CI, per run and engine, for the SMALL
#: loop on one and two ranks (docs/validation.md, "Closed loop"). Seven loops alone here
#: (2026-11-29, 05:10-05:50 UTC, load average 5-13 on 2 cores; 35 runs, each engine) gave
#: −16.4 … −32.6 % (analytical) and −17.9 … −41.3 % (DES), and two inside the whole suite
#: (06:10-06:27 UTC) down to −48.4 %: ddlsim too fast, always, by what it does not model
#: (numpy's per-call overhead and in-cache passes). The bounds are one-sided around that
#: bias: −60 % keeps 12 points below the worst; a prediction above the measurement by more
#: than 20 % has counted something twice. Not the issue's 10 % target, which ddlsim misses.
BOUND = (-0.6, 0.2)
#: … for the forward and backward alone (predicted compute / measured CPU time − 1): −10.2 …
#: −28.3 % alone, −36.3 and −39.9 % inside the suite. A compute counted twice (+20 % or more
#: on that bias) or halved (−64 % or less) fails it.
COMPUTE_BOUND = (-0.5, 0.15)
#: … for the exchange and update (predicted iteration − compute against the measured part):
#: −23.0 … −57.8 % (numpy's Adam, in-cache passes ddlsim does not model, is most of it). An
#: exchange or update left out (−100 %) fails it.
EXCHANGE_BOUND = (-0.8, 0.3)
#: ``calibrate fit --max-rel-rmse`` of the loop: its default, 25 %, refused one 2-rank
#: calibration of three at load 9 (an all-gather curve at 27.3 %); each curve's error is
#: kept in the rows (``fit_rel_rmse``), and what an error of the curves does to the
#: prediction is what the bounds above measure.
FIT_BOUND = 0.5

TINY = GPTShape(layers=2, hidden=8, heads=2, vocab=11, seq=5, batch=2)


def test_backward_is_the_gradient_of_the_forward():
    model = GPT2(TINY, seed=1, dtype=np.float64)
    model.p[:TINY.params] += np.random.default_rng(3).normal(0, 0.3, TINY.params)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, TINY.vocab, (2, 5)), rng.integers(0, TINY.vocab, (2, 5))
    _, acts = model.forward(idx, tgt)
    model.backward(acts)
    numeric = np.empty(TINY.params)
    for j in range(TINY.params):
        keep = model.p[j]
        model.p[j] = keep + 1e-6
        up, _ = model.forward(idx, tgt)
        model.p[j] = keep - 1e-6
        down, _ = model.forward(idx, tgt)
        model.p[j] = keep
        numeric[j] = (up - down) / 2e-6
    assert np.abs(model.g[:TINY.params] - numeric).max() < 1e-7 * max(1, np.abs(numeric).max())
    assert not model.g[TINY.params:].any()  # the pad gets no gradient


def test_adam_is_kingma_and_ba_algorithm_1():
    """The blocked, rearranged update (ddlsim/reference/gpt2.py ``Adam``) is Algorithm 1 of
    Kingma & Ba 2015 step for step, over more than one block."""
    rng = np.random.default_rng(0)
    n = Adam.BLOCK + 100
    p = rng.normal(size=n).astype(np.float32)
    opt, want = Adam(n, lr=1e-2), p.astype(np.float64)
    m = v = np.zeros(n)
    for t in range(1, 4):
        g = rng.normal(size=n).astype(np.float32)
        opt.step(p, g)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
        want -= 1e-2 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(p, want, rtol=0, atol=2e-6)


def test_adam_steps_a_slice_from_a_shard_of_its_own_as_from_the_whole_buffer():
    """The reduce-scatter update steps its slice of the parameters from the shard the
    collective wrote (``g_lo``): bit for bit the step from the same values in place."""
    rng = np.random.default_rng(1)
    n, lo, hi = 2 * Adam.BLOCK + 60, Adam.BLOCK - 7, 2 * Adam.BLOCK + 30
    p = rng.normal(size=n).astype(np.float32)
    g = rng.normal(size=n).astype(np.float32)
    whole, shard = Adam(n), Adam(n)
    p1, p2 = p.copy(), p.copy()
    for _ in range(2):
        whole.step(p1, g, lo, hi)
        shard.step(p2, g[lo:hi].copy(), lo, hi, g_lo=0)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(p1[:lo], p[:lo])  # outside the slice: untouched


def test_the_loss_gradient_carries_the_mean_over_ranks():
    """With ``ranks = n`` the backward's gradients are 1/n of one rank's (the exchange's sum
    is then the mean: no pass of its own)."""
    shape = GPTShape(1, 16, 2, 32, 8, 2)
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    one, three = GPT2(shape, seed=0), GPT2(shape, seed=0)
    three.ranks = 3
    for model in (one, three):
        model.backward(model.forward(idx, idx)[1])
    np.testing.assert_allclose(three.g * 3, one.g, rtol=1e-5, atol=1e-6)

def test_the_model_is_the_one_ddlsim_predicts(tmp_path):
    cfg = ddlsim.load_config(SMALL.run_config(1, "ddp", "cpu-10gbe"))
    assert ddlsim.predict(cfg).parameter_count == SMALL.shape.params


@pytest.mark.parametrize("field, value", [
    ("parallel.tensor_model_parallel_size", 2),
    ("train.dtype", "bf16"),
    ("parallel.overlap_grad_reduce", True),
    ("model.dropout", True),
    ("parallel.dp_strategy", "reduce_scatter"),  # allowed: the control case
])
def test_the_trainer_refuses_what_it_does_not_run(field, value):
    doc = SMALL.run_config(2, "ddp", {"preset": "cpu-10gbe", "nodes": 2, "devices_per_node": 1})
    section, name = field.split(".")
    doc[section][name] = value
    if name == "tensor_model_parallel_size":
        doc["parallel"]["data_parallel_size"] = 1
        doc["train"]["global_batch_size"] = SMALL.batch
    cfg = ddlsim.load_config(doc)
    if value == "reduce_scatter":
        check_plan(cfg, 2)
        with pytest.raises(ValueError, match=r"data_parallel_size = 2; allowed: the number "
                                             r"of MPI ranks, 3"):
            check_plan(cfg, 3)
        return
    with pytest.raises(ValueError, match="the reference trainer cannot run " +
                       (section if section == "parallel" and name.startswith("tensor")
                        else field.replace(".", r"\."))):
        check_plan(cfg, 2 if name != "tensor_model_parallel_size" else 1)


def _serial(shape: GPTShape, ranks: int, steps: int) -> np.ndarray:
    """Parameters after ``steps`` Adam steps on the average gradient of every rank's batch
    (the trainer's data: ``default_rng([0, rank])``)."""
    model, opt = GPT2(shape, seed=0), Adam(shape.padded)
    batches = []
    for r in range(ranks):
        rng = np.random.default_rng([0, r])
        batches.append((rng.integers(0, shape.vocab, (shape.batch, shape.seq)),
                        rng.integers(0, shape.vocab, (shape.batch, shape.seq))))
    for _ in range(steps):
        total = np.zeros_like(model.g)
        for idx, tgt in batches:
            _, acts = model.forward(idx, tgt)
            model.backward(acts)
            total += model.g
        model.g[:] = total / ranks
        opt.step(model.p, model.g)
    return model.p[:shape.params].copy()


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_each_update_trains_as_serial_training_on_the_mean_gradient(tmp_path, strategy):
    doc = SMALL.run_config(2, strategy, {"preset": "cpu-10gbe", "nodes": 1})
    doc["model"].update(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                        vocab_size=64, max_position_embeddings=16)
    doc["train"].update(seq_length=16, micro_batch_size=2, global_batch_size=4)
    doc["parallel"]["grad_bucket_size"] = 4096  # ddp: several buckets
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run(MPIRUN + [sys.executable, "-m", "ddlsim.reference.train",
                                    str(tmp_path / "run.yaml"), "--iters", "2", "--warmup", "1",
                                    "--json", str(tmp_path / "r.json"), "--save-params",
                                    str(tmp_path / "p{rank}.npy")],
                          capture_output=True, text=True, timeout=120, env=mpi_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = _serial(GPTShape(1, 32, 2, 64, 16, 2), 2, 3)
    for rank in (0, 1):
        got = np.load(tmp_path / f"p{rank}.npy")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["strategy"] == strategy and out["loss_last"] < out["loss_first"]
    assert len(out["times_s"]) == 2 and out["median_s"] > 0


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("program", ["train", "interleaved"])
def test_more_ranks_than_cores_are_refused_naming_ranks_cores_and_the_option(tmp_path,
                                                                            program):
    n = cpu_cores() + 1
    doc = SMALL.run_config(n, "ddp", {"preset": "cpu-10gbe", "nodes": 1,
                                      "devices_per_node": n})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    out = [str(tmp_path)] if program == "interleaved" else []
    proc = subprocess.run(mpirun(n) + [sys.executable, "-m", f"ddlsim.reference.{program}",
                                       *out, str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=120, env=mpi_env())
    assert proc.returncode != 0
    assert f"error: {n} ranks on this node share {n - 1} usable CPU cores" in proc.stderr
    assert "--allow-shared-cores" in proc.stderr and "Traceback" not in proc.stderr


@needs_mpi
@pytest.mark.mpi
def test_closed_loop_predicts_the_measured_runs_within_the_bound(tmp_path):
    rows = run_loop(tmp_path, SMALL, ranks=(1, 2), statistic="min",
                    max_rel_rmse=FIT_BOUND, log=print)
    print(summary_line(rows))
    assert [(r["ranks"], r["strategy"]) for r in rows] == \
        [(1, "ddp")] + [(2, s) for s in STRATEGY_NAMES]  # none refused
    for row in rows:
        assert row["loss_last"] < row["loss_first"]  # it trained
        for engine in ("analytical", "des"):
            assert BOUND[0] <= row[f"error_{engine}"] <= BOUND[1], row
        compute = row["predicted_compute_s"] / row["measured_compute_s"] - 1
        assert COMPUTE_BOUND[0] <= compute <= COMPUTE_BOUND[1], row
        exchange = row["predicted_analytical_s"] - row["predicted_compute_s"]
        assert EXCHANGE_BOUND[0] <= exchange / row["measured_exchange_s"] - 1 \
            <= EXCHANGE_BOUND[1], row



#: predicted / measured − 1 allowed in CI for ranks sharing a core, per run and engine, in
#: wall time. Two ranks on one core of this machine (the test below, alone, 2026-12-01
#: 08:20 UTC): −10.2 … +1.3 %; the loop's 3-4 ranks on 2 cores (docs/validation.md, "Closed
#: loop"): −9.1 … −0.1 %. A share left out (each rank a whole core: about −50 %) or counted
#: twice (+100 %) fails it.
SHARED_BOUND = (-0.3, 0.3)


@needs_mpi
@pytest.mark.mpi
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux's CPU affinity")
def test_closed_loop_predicts_ranks_sharing_a_core_in_wall_time(tmp_path):
    """The loop past the usable cores: this process's affinity narrowed to one core, which
    mpirun and its ranks inherit, so two ranks take turns on it on any machine. Each run is
    compared in wall time (forward and backward, exchange and update) against ddlsim's
    prediction with each rank a device of half a core (``shared_local_system``)."""
    keep = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(keep)})
    try:
        rows = run_loop(tmp_path, SMALL, ranks=(2,), statistic="min",
                        max_rel_rmse=FIT_BOUND, log=print)
    finally:
        os.sched_setaffinity(0, keep)
    print(summary_line(rows))
    assert [r["strategy"] for r in rows] == list(STRATEGY_NAMES)
    system = yaml.safe_load((tmp_path / "run-ddp-2.yaml").read_text())["system"]
    assert system["devices_per_node"] == 2 and "2 ranks sharing 1 core:" in \
        system["device"]["source"]
    for row in rows:
        assert row["clock"] == "wall" and row["cores"] == 1, row
        assert row["loss_last"] < row["loss_first"]
        for engine in ("analytical", "des"):
            assert SHARED_BOUND[0] <= row[f"error_{engine}"] <= SHARED_BOUND[1], row


_FAULTS = """
import resource, numpy as np
from ddlsim.reference.machine import cache_allocations
cached = {cache}
x = np.ones(2 ** 21, dtype=np.float32)  # 8 MiB temporaries, four alive at once (32 MiB)
y = [x + x for _ in range(4)]; del y
f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    y = [x + x for _ in range(4)]; del y
print(cached, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_cached_allocations_fault_no_pages_in_again():
    """With :func:`cache_allocations` four temporaries of 8 MiB made again take their pages
    from the heap (no page faults); with glibc's defaults the freed heap top (32 MiB, over
    its trim threshold) goes back to the system and its pages are faulted in anew (10,168
    in the five rounds here, 2026-11-29; a separate process each: the setting is
    process-wide)."""
    got = {}
    for cache in (False, True):
        code = _FAULTS.replace("{cache}", "cache_allocations()" if cache else "False")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        got[cache] = (out[0] == "True", int(out[1]))
    if not got[True][0]:
        pytest.skip("the C library is not glibc (no mallopt)")
    assert got[True][1] < 100 and got[False][1] >= 5 * 1000


def test_the_accounting_marks_only_ops_of_the_trace_and_every_one_it_charges(tmp_path):
    """Each numpy step of the reference model is charged to an op ddlsim's trace of the same
    run has (ddlsim/reference/accounting.py), and every compute op of that trace gets some
    numpy work: a renamed or new trace op fails here, not silently in the accounting."""
    from ddlsim.reference.accounting import account, measured_ops, predicted_ops
    doc = SMALL.run_config(1, "ddp", {"preset": "cpu-10gbe", "nodes": 1})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    predicted = predicted_ops(ddlsim.load_config(tmp_path / "run.yaml"))
    measured = measured_ops(SMALL.shape, iters=1, warmup=0)
    assert set(measured) - {"iteration"} == set(predicted)
    rows = account(measured, predicted)
    assert rows[-1]["op"] == "total" and rows[-1]["measured_s"] == pytest.approx(
        measured["iteration"] + measured["optimizer"])


def test_closed_loop_ops_prints_each_compared_runs_account(tmp_path, capsys):
    """``benchmarks/closed_loop_ops.py`` prints the account the loop stored per run, skips
    refused runs, and refuses a folder without a loop, naming the command that makes one."""
    from benchscripts import load_script
    from ddlsim.reference.accounting import account
    script = load_script("closed_loop_ops")
    ops = account({"fwd.mlp": 0.010, "optimizer": 0.004}, {"fwd.mlp": 0.009, "optimizer": 0.002})
    (tmp_path / "closed_loop.json").write_text(json.dumps([
        {"strategy": "ddp", "ranks": 1, "ops": ops},
        {"strategy": "ddp", "ranks": 3, "refused": "3 ranks on this node share 2 cores"}]))
    assert script.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ddp on 1 rank(s)" in out and "3 rank" not in out
    assert [ln.split()[-1] for ln in out.splitlines()[1:]] == ["-10.0%", "-50.0%", "-21.4%"]
    with pytest.raises(SystemExit):
        script.main([str(tmp_path / "none")])
    assert "benchmarks/closed_loop.py -o" in capsys.readouterr().err


def test_the_calibrated_sizes_reach_past_a_cliff_on_either_side_of_the_gradient_buffer():
    """Three sizes (two an octave) below the sliced update's half slice and past the buffer's
    next power of two times eight: a fitted segment needs three (loop.COMM_FACTOR)."""
    buffer = SMALL.shape.padded * 4  # 13.5 MB
    for ranks in (2, 3, 4):
        lo, hi = comm_sizes(SMALL.shape, ranks)
        assert lo <= buffer / ranks / 4 < 2 * lo and hi == 128 * 2 ** 20  # 32-128 MiB past
    assert COMM_FACTOR ** 2 == pytest.approx(2.0)
    assert comm_ops(("ddp",)) == ["all_reduce", "sendrecv"]
    assert comm_ops(STRATEGY_NAMES) == ["all_reduce", "reduce", "broadcast", "reduce_scatter",
                                        "all_gather", "sendrecv"]


def test_the_measured_time_is_the_statistic_of_each_part():
    run = {"compute_cpu_s": [0.3, 0.1, 0.2], "exchange_s": [0.05, 0.01, 0.03],
           "compute_wall_s": [0.6, 0.2, 0.4], "exchange_wall_s": [0.09, 0.07, 0.08]}
    assert measured_s(run, "min") == pytest.approx(0.13)  # the exchange's median
    assert measured_s(run, "median", "median") == pytest.approx(0.23)
    assert measured_s(run, "min", "min") == pytest.approx(0.11)
    # ranks sharing cores: the wall time of both parts, never the CPU time
    assert measured_s(run, "min", clock="wall") == pytest.approx(0.28)
    assert measured_parts(run, "median", "min", "wall") == pytest.approx((0.4, 0.07))


def test_ranks_sharing_cores_get_a_share_of_a_core_each_and_the_jobs_time_them_in_wall_time(
        monkeypatch):
    """Past the usable cores the loop predicts on ``shared_local_system`` (each rank a
    device of cores / ranks of a core: its FLOP/s, bandwidth and memory; its kernel classes'
    efficiencies and the link as measured) and runs its jobs with wall-time clocks; up to
    the cores nothing changes (CPU time, one device per rank)."""
    from ddlsim.reference import loop
    from ddlsim.reference.machine import local_system, shared_local_system
    own = local_system(2, 90e9, 20e9, (2e-6, 5e9), 16e9, "now", {"norm": 0.5}, 2)
    shared = shared_local_system(own, 6)
    assert shared["devices_per_node"] == 6 and shared["name"] == "this-machine-x6"
    dev = shared["device"]
    assert dev["peak_flops"] == {"fp32": pytest.approx(30e9)}
    assert dev["memory_bandwidth_Bps"] == pytest.approx(20e9 / 3)
    assert dev["memory_bytes"] == pytest.approx(16e9 / 3)
    assert dev["elementwise_efficiency"] == {"norm": 0.5} and dev["spare_cores"] == 0
    assert shared["intra_node"] == own["intra_node"]
    assert "6 ranks sharing 2 cores: each rate and the memory × 2/6" in dev["source"]
    # a device with a framework's dispatch per op (the torch loop's): that takes 6/2 as long
    own["device"]["launch"] = {"host_launch_s": 0.0, "eager_op_s": 0.0, "stream_gap_s": 2e-6,
                               "graph_gap_s": 2e-6, "source": "torch.add in a loop"}
    launch = shared_local_system(own, 6)["device"]["launch"]
    assert launch == {"host_launch_s": 0.0, "eager_op_s": 0.0,
                      "stream_gap_s": pytest.approx(6e-6), "graph_gap_s": pytest.approx(6e-6),
                      "source": "torch.add in a loop"}
    cfg = ddlsim.load_config(SMALL.run_config(6, "ddp", shared))
    assert cfg.system.devices_per_node == 6  # a system ddlsim predicts on
    monkeypatch.setattr(loop, "cpu_cores", lambda: 2)
    assert loop._shared(2) == [] and loop._shared(1) == []
    assert loop._shared(3) == ["--clock", "wall", "--allow-shared-cores"]


def test_the_summary_counts_the_runs_whose_ranks_shared_cores():
    rows = [{"strategy": "ddp", "ranks": 2, "clock": "cpu", "cores": 2,
             "error_analytical": -0.02, "error_des": -0.03},
            {"strategy": "ddp", "ranks": 4, "clock": "wall", "cores": 2,
             "error_analytical": 0.05, "error_des": -0.06},
            {"strategy": "ddp", "ranks": 8, "refused": "calibrate fit refused"}]
    assert summary_line(rows) == ("closed loop: 2 runs, max |error| 6.0 %, mean 4.0 %; 1 of "
                                  "them with ranks sharing 2 cores (wall time); 1 run(s) "
                                  "refused")
    assert summary_line(rows[:1]) == "closed loop: 1 runs, max |error| 3.0 %, mean 2.5 %"


def _has_torch_gloo() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not _has_torch_gloo(), reason="PyTorch with Gloo is not installed "
                                                  "(optional: pip install 'ddlsim[torch]')")
@pytest.mark.parametrize("plan, change", [
    ("ddp", {"parallel": {"overlap_grad_reduce": True}}),
    ("fsdp", {"parallel": {"zero_stage": 3}}),
    ("pipeline", {"parallel": {"data_parallel_size": 1, "pipeline_model_parallel_size": 2,
                               "schedule": "gpipe"}, "train": {"global_batch_size": 8}}),
])
def test_torch_reference_runs_the_plan_its_config_describes(tmp_path, plan, change):
    doc = SMALL.run_config(2, "ddp", {"preset": "cpu-10gbe", "nodes": 1})
    doc["model"]["num_hidden_layers"] = 2  # two stages
    for key, part in change.items():
        doc[key].update(part)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    assert ddlsim.predict(ddlsim.load_config(tmp_path / "run.yaml")).iteration_time_s > 0
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "ddlsim.reference.torch_train",
                           str(tmp_path / "run.yaml"), "--iters", "2", "--warmup", "1",
                           "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["plan"] == plan and out["loss_last"] < out["loss_first"]
    assert len(out["times_s"]) == 2 and out["median_s"] > 0


@pytest.mark.parametrize("run, name, error", [
    ("a", "ddp-1", -1.5), ("b", "ddp-1", 12.3), ("c", "ddp-2", -39.6),
    ("c", "reduce_scatter-2", -40.5), ("e", "ddp-1", 2.5)])
def test_the_recorded_runs_predict_as_docs_validation_says(run, name, error):
    """docs/validation.md's compared runs, from their saved files: the run config and
    profile give the recorded prediction (within 3 %, room for later model changes that
    docs/validation.md would then restate: the QKV bias added apart, which their
    megatron-lm-2021 base stack declares since 0fe9ce3 and numpy does, moved them +2.0-2.2 %),
    and the recorded error follows."""
    from pathlib import Path

    from ddlsim.calibration import CalibrationProfile
    root = Path(__file__).parents[1] / "benchmarks" / "data" / "closed_loop_2026-11-29" / run
    cfg = ddlsim.load_config(root / f"run-{name}.yaml")
    profile = CalibrationProfile.load(root / f"profile{name[-1]}.yaml")
    got = ddlsim.predict(cfg, calibration=profile)
    recorded = json.loads((root / f"predicted-{name}.json").read_text())
    assert got.iteration_time_s == pytest.approx(recorded["analytical"]["iteration_time_s"],
                                                 rel=0.03)
    measured = json.loads((root / f"measured-{name}.json").read_text())
    got_error = recorded["analytical"]["iteration_time_s"] / measured["median_s"] - 1
    assert round(100 * got_error, 1) == error
    assert measured["cpu_share_median"] >= 0.9  # compared by the loop of the time


def test_the_scripts_ranks_default_to_one_to_four_and_in_cpu_time_stop_at_the_cores(
        tmp_path, monkeypatch):
    """``benchmarks/closed_loop.py``: ranks 1-4 unless ``--ranks`` says otherwise (past the
    usable cores they share them, in wall time); ``--torch --clock cpu`` cannot time shared
    cores, so its default keeps the ranks within them, while ``--ranks`` given is passed as
    given (and refused by the loop)."""
    from benchscripts import load_script
    from ddlsim.reference import mpijobs, torch_loop
    script = load_script("closed_loop")
    got = []
    monkeypatch.setattr(torch_loop, "torch_available", lambda: True)
    monkeypatch.setattr(torch_loop, "run_torch_loop",
                        lambda work, model, counts, *a, **k: got.append(counts) or [])
    monkeypatch.setattr(mpijobs, "cpu_cores", lambda: 2)
    for argv in (["--torch"], ["--torch", "--clock", "cpu"],
                 ["--torch", "--clock", "cpu", "--ranks", "1,3"]):
        assert script.main([*argv, "-o", str(tmp_path)]) == 0
    assert got == [(1, 2, 3, 4), (1, 2), (1, 3)]


def test_an_uneven_count_past_the_cores_is_refused_without_a_job(tmp_path, monkeypatch):
    """3 ranks on 2 cores: each update a refused row with the reason (the cores' run queues
    uneven, sharedcores.uneven_refusal), counted as refused in the summary; no MPI job runs
    for it (loop_ranks, which would start one, is not called)."""
    from ddlsim.reference import loop, mpijobs
    monkeypatch.setattr(mpijobs, "cpu_cores", lambda: 2)
    monkeypatch.setattr(loop, "loop_ranks", lambda *a, **k: pytest.fail("a job was run"))
    lines = []
    rows = run_loop(tmp_path, SMALL, ranks=(3,), statistic="min", log=lines.append)
    assert [(r["strategy"], r["ranks"]) for r in rows] == [(s, 3) for s in STRATEGY_NAMES]
    assert all("allowed: a multiple of 2 ranks" in r["refused"] for r in rows)
    assert sum("refused: ranks per node = 3" in ln for ln in lines) == 4
    assert summary_line(rows) == "closed loop: 0 runs, no error measured; 4 run(s) refused"
    assert json.loads((tmp_path / "closed_loop.json").read_text()) == rows
