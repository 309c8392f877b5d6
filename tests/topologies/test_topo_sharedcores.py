"""ddlsim.topologies.sharedcores: a CPU node's cores time-shared by more MPI ranks."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.topologies.sharedcores import share_cores, shared_core_overrides

#: examples/proxies/dlrm.yaml resized to one rank on the kvm-2core preset
_ONE_RANK = ["system.preset=kvm-2core", "system.nodes=1", "parallel.data_parallel_size=1",
             "train.micro_batch_size=2048", "model.tables=[{rows: 80000, pooling: 5.05}]"]


@pytest.fixture(scope="module")
def kvm():
    return ddlsim.load_config("examples/proxies/dlrm.yaml", overrides=_ONE_RANK).system


@pytest.mark.parametrize("ranks", [2, 4, 6, 8])
def test_each_rank_gets_cores_over_ranks_of_a_core(kvm, ranks):
    """kvm-2core: 134.4 GFLOP/s, 10.7 GB/s and 12.6 GB per core (data/systems.yaml); r ranks
    on its 2 cores each get 2/r of them (CFS's equal shares)."""
    got = share_cores(kvm, ranks)
    assert got.devices_per_node == ranks and got.nodes == 1
    assert got.device.peak_flops == pytest.approx(
        {k: 134.4e9 * 2 / ranks for k in ("fp32", "tf32", "bf16")}, rel=1e-12)
    assert got.device.memory_bandwidth_Bps == pytest.approx(10.7e9 * 2 / ranks, rel=1e-12)
    assert got.device.memory_bytes == pytest.approx(12.6e9 * 2 / ranks, rel=1e-12)
    assert got.intra_node == kvm.intra_node  # communication: a calibration at r ranks
    # the node's total throughput is its cores', whatever the rank count
    assert ranks * got.device.peak_flops["fp32"] == pytest.approx(2 * 134.4e9, rel=1e-12)


def test_overrides_make_the_same_system_through_the_config(kvm):
    cfg = ddlsim.load_config("examples/proxies/dlrm.yaml",
                             overrides=_ONE_RANK + shared_core_overrides(kvm, 4))
    want = share_cores(kvm, 4)
    assert cfg.system.devices_per_node == 4
    assert cfg.system.device == want.device


def test_the_hosts_time_per_kernel_runs_on_the_shared_cores_too(kvm):
    """A framework's dispatch per op (``device.launch``) is CPU work on the same cores, so
    it takes ranks / cores as long; a device without launch times stays without."""
    from ddlsim.config_system import LaunchSpec
    launch = LaunchSpec(host_launch_s=1e-6, eager_op_s=2e-6, stream_gap_s=4e-6,
                        graph_gap_s=3e-6, source="a test")
    got = share_cores(kvm.model_copy(update={
        "device": kvm.device.model_copy(update={"launch": launch})}), 6).device.launch
    assert (got.host_launch_s, got.eager_op_s, got.stream_gap_s, got.graph_gap_s) == \
        pytest.approx((3e-6, 6e-6, 12e-6, 9e-6), rel=1e-12)
    assert got.source == "a test"
    assert share_cores(kvm, 6).device.launch is kvm.device.launch is None


@pytest.mark.parametrize("ranks", [1, 0, 2.5, True])
def test_fewer_ranks_than_cores_or_not_an_integer_is_refused(kvm, ranks):
    with pytest.raises(ConfigError, match=r"ranks per node = .*at least 2"):
        share_cores(kvm, ranks)


def test_more_than_one_node_is_refused(kvm):
    two = kvm.model_copy(update={"nodes": 2})
    with pytest.raises(ConfigError, match=r"system.nodes = 2: .*one node only"):
        share_cores(two, 4)


@pytest.mark.parametrize("ranks", [3, 5, 7])
def test_ranks_that_do_not_divide_over_the_cores_are_refused(kvm, ranks):
    """3 ranks on 2 cores: one core's run queue holds two ranks, the other's one, and a
    phase between synchronisations runs at up to the busiest core's pace (1.58-2.00 W
    measured against the fair share's 1.5 W): refused, naming the counts and what is
    allowed, in the estimate and in its ``--set`` values alike."""
    for make in (share_cores, shared_core_overrides):
        with pytest.raises(ConfigError, match=rf"ranks per node = {ranks} on the 2 cores of "
                                              rf"'kvm-2core'.*allowed: a multiple of 2 ranks"):
            make(kvm, ranks)


def test_the_reference_loops_refuse_an_uneven_count_before_running_it(monkeypatch):
    """The numpy and torch loops ask :func:`uneven_share` first: None within the cores and
    for a multiple of them, the refusal past them otherwise."""
    from ddlsim.reference import mpijobs
    monkeypatch.setattr(mpijobs, "cpu_cores", lambda: 2)
    assert [mpijobs.uneven_share(n) for n in (1, 2, 4, 8)] == [None] * 4
    assert "ranks per node = 3 on the 2 cores of 'this machine'" in mpijobs.uneven_share(3)
