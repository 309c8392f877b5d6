"""``parallel.cp_comm_type`` left unset takes the software stack's K/V exchange
(``kernels.cp_comm_type`` in ddlsim/data/software.yaml): Megatron-Core's ``--cp-comm-type``
default ``p2p`` (a ring), torchtitan's ``context_parallel_rotate_method`` default
``allgather``; a value the plan gives always wins and is kept as given."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.planinfo import plan_fields
from ddlsim.workloads.decoder.plan import resolve_plan

from cpbase import BASE



def config(stack: str, comm: str | None = None, kernels: dict | None = None) -> ddlsim.RunConfig:
    d = copy.deepcopy(BASE)
    d["system"]["software"] = {"stack": stack, "kernels": kernels or {}}
    if stack.startswith("torchtitan"):   # its TP is always sequence-parallel (tp_needs_sp)
        d["parallel"] = {**d["parallel"], "sequence_parallel": True}
    if comm is not None:
        d["parallel"]["cp_comm_type"] = comm
    return ddlsim.load_config(d)


def used(cfg: ddlsim.RunConfig) -> str:
    """The exchange the layer partitioner runs."""
    return resolve_plan(cfg, cfg.model.shape()).cp_comm


@pytest.mark.parametrize("stack, comm, word", [
    ("megatron-core-2024", "p2p", "ring"), ("megatron-core-2025", "p2p", "ring"),
    ("torchtitan-2024", "all_gather", "all-gather"),
    ("torchtitan-2025", "all_gather", "all-gather")])
def test_unset_takes_the_stacks_exchange_and_says_so(stack, comm, word):
    cfg = config(stack)
    assert cfg.parallel.cp_comm_type is None                 # the config is not rewritten
    assert used(cfg) == comm
    assert cfg.software.cp_comm_type == comm
    source = cfg.software.sources["cp_comm_type"]
    assert ("Megatron-LM" if stack.startswith("megatron") else "torchtitan") in source
    sp = " SP (tp_needs_sp)" if stack.startswith("torchtitan") else ""   # its TP always is
    assert cfg.family.plan_summary(cfg).startswith(f"TP2{sp} × CP4 {word} ")
    assert plan_fields(cfg)["cp_comm_type"] == comm          # the JSON result's plan


@pytest.mark.parametrize("stack", ["megatron-core-2025", "torchtitan-2025"])
@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_the_plans_value_always_wins(stack, comm):
    cfg = config(stack, comm)
    assert cfg.parallel.cp_comm_type == comm
    assert used(cfg) == comm
    assert cfg.software.sources["cp_comm_type"] == "parallel.cp_comm_type"


def test_the_plans_value_wins_over_a_stack_override():
    cfg = config("torchtitan-2025", "p2p", kernels={"cp_comm_type": "all_gather"})
    assert used(cfg) == "p2p"
    cfg = config("megatron-core-2025", kernels={"cp_comm_type": "all_gather"})
    assert used(cfg) == "all_gather"
    assert cfg.software.sources["cp_comm_type"] == "system.software.kernels"


def test_unset_predicts_what_the_stacks_value_given_predicts():
    # ZeRO-0 written: torchtitan's default FSDP2 over the CP ranks (ZeRO-3) would hide the
    # exchange of this small layer behind its gathers, and ring and all-gather read alike
    def plan(comm=None):
        cfg = config("torchtitan-2025", comm)
        return cfg.model_copy(update={"parallel": cfg.parallel.model_copy(
            update={"zero_stage": 0})})
    unset = ddlsim.predict(plan(), check_fit=False)
    given = ddlsim.predict(plan("all_gather"), check_fit=False)
    ring = ddlsim.predict(plan("p2p"), check_fit=False)
    assert unset.iteration_time_s == given.iteration_time_s != ring.iteration_time_s


def test_no_plan_field_for_a_model_without_context_parallelism():
    d = copy.deepcopy(BASE)
    d["parallel"]["context_parallel_size"] = 1
    d["parallel"]["sequence_parallel"] = True   # torchtitan's TP always is (tp_needs_sp)
    d["train"]["global_batch_size"] = 4
    d["system"]["software"] = "torchtitan-2025"
    assert "cp_comm_type" not in plan_fields(ddlsim.load_config(d))
