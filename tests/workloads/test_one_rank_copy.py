"""One-rank collectives with separate send and receive buffers (``parallel.collective_buffers:
separate``): MPI copies the send buffer into the receive buffer on the calling rank
(:mod:`ddlsim.workloads.onerankcopy`), a pass of 2 × the bytes at the device's memory
bandwidth on the compute stream, in both engines; in place, or on more ranks, nothing moves."""

from __future__ import annotations

import warnings

import pytest

import ddlsim
from ddlsim.workloads.onerankcopy import _with_copies, copy_op
from ddlsim.workloads.trace import Collective, Compute, Loop, Op

ROOT = "examples/proxies"
KVM = ["system.preset=kvm-2core", "system.nodes=1"]
#: resnet152.cpp:23 allreduce_sizes, 60,192,808 floats of 4 B
RESNET152_BYTES = 4 * (6511592 + 6567936 + 5905920 + 6113280 + 6176256 + 6112768 + 6176256
                       + 6112768 + 5321216 + 5194816)
#: kvm-2core's device memory_bandwidth_Bps (ddlsim/data/systems.yaml)
KVM_BPS = 10.7e9


def _resnet152(dp: int, buffers: str, system=KVM):
    return ddlsim.load_config(f"{ROOT}/resnet152.yaml", overrides=system + [
        f"parallel.data_parallel_size={dp}", "train.micro_batch_size=128",
        f"train.global_batch_size={128 * dp}", f"parallel.collective_buffers={buffers}"])


def _times(cfg) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {e: ddlsim.predict(cfg, e, check_fit=False).iteration_time_s
                for e in ("analytical", "des")}


def test_resnet152_on_one_rank_pays_one_copy_of_its_gradients_in_both_engines():
    before, after = _times(_resnet152(1, "in_place")), _times(_resnet152(1, "separate"))
    copy_s = 2 * RESNET152_BYTES / KVM_BPS          # read + write, 45.0 ms
    for engine in before:
        assert after[engine] - before[engine] == pytest.approx(copy_s, rel=1e-9)


def test_more_ranks_or_in_place_change_nothing():
    assert _times(_resnet152(2, "separate")) == _times(_resnet152(2, "in_place"))
    cfg = _resnet152(1, "in_place")
    assert cfg.parallel.collective_buffers == "in_place"   # the default
    names = [op.name for c in ddlsim.build_workload(cfg).classes
             for b in c.program.blocks.values() for op in b.flat.ops]
    assert not any(n.endswith("one_rank_copy") for n in names)


def test_the_copy_sits_on_the_calling_rank_before_the_call():
    work = ddlsim.build_workload(_resnet152(1, "separate"))
    ops = work.classes[0].program.blocks["B.sync"].flat.ops
    calls = [i for i, op in enumerate(ops) if type(op.payload) is Collective]
    assert len(calls) == 10
    for i in calls:
        copy = ops[i - 1]
        assert copy.stream == "compute" and copy.payload == copy_op(ops[i].payload)
        assert i - 1 in ops[i].deps and set(copy.deps) <= set(ops[i].deps)
    work.validate()


def test_one_buffer_ops_and_loops():
    g = Collective("g", "all_reduce", "one", 8.0)
    ops = (Op(Compute("c", 0.0, seconds=1.0)),
           Op(g, "dp", (0,)),
           Op(Collective("b", "broadcast", "one", 8.0), "dp", (1,)),
           Op(Loop("l", (Op(Compute("d", 0.0, seconds=1.0)), Op(g, "dp", (0,))), 2), deps=(2,)),
           Op(Collective("w", "all_reduce", "two", 8.0), "dp", (3,)))
    out = _with_copies(ops, {"one"})
    assert [o.name for o in out] == ["c", "g.one_rank_copy", "g", "b", "l", "w"]
    assert out[2].deps == (0, 1) and out[3].deps == (2,) and out[4].deps == (3,)
    assert out[5].deps == (4,)                   # renumbered past the inserted copy
    body = out[4].payload.body
    assert [o.name for o in body] == ["d", "g.one_rank_copy", "g"] and body[2].deps == (0, 1)
    assert copy_op(g).bytes == 16.0 and copy_op(g).kind == "elementwise"
    assert _with_copies(ops, {"other"}) is ops


def test_nccl_one_rank_copy_is_refused_with_the_field():
    cfg = _resnet152(1, "separate", ["system.preset=dgx-a100", "system.nodes=1"])
    with pytest.raises(ddlsim.ConfigError, match=r"collective_buffers = 'separate'.*'nccl'"):
        ddlsim.build_workload(cfg)


def test_proxy_examples_that_name_two_buffers_say_so():
    for name in ("resnet152", "resnet152_scal", "dlrm", "cosmoflow", "resnet50"):
        assert ddlsim.load_config(f"{ROOT}/{name}.yaml").parallel.collective_buffers == \
            "separate", name
    # comm_only/gpt2_large.cpp:107 calls its all-reduces only on more than one rank
    assert ddlsim.load_config(f"{ROOT}/gpt2_large.yaml").parallel.collective_buffers == \
        "in_place"


@pytest.mark.parametrize("name, family", [("gpt2_large", "decoder"), ("bert_large", "bert")])
def test_families_that_drop_one_rank_collectives_refuse_separate_buffers(name, family):
    """The decoder and BERT families leave one-rank collectives out of their traces, so
    ``separate`` would be ignored there: refused, naming the field and the value."""
    from ddlsim.errors import ConfigError
    with pytest.raises(ConfigError, match=f"collective_buffers = 'separate'.*{family}"):
        ddlsim.load_config(f"{ROOT}/{name}.yaml",
                           overrides=["parallel.collective_buffers=separate"])
