"""What the pipeline memory tests share: their plan (:func:`pp4_config`), and the check that,
with a framework rule switched on for Megatron-Core (a what-if: torchtitan's plans are searched
by the exact engine), the vectorised search tier's memory per device equals the exact
engine's on PP 2 and 4."""
from __future__ import annotations

import dataclasses

import pytest

import ddlsim
from ddlsim.workloads.framework_memory import FRAMEWORKS


def pp4_config(stack: str, seq: int = 2048) -> dict:
    """llama-3.1-8b cut to 8 layers, TP 2 with SP, PP 4, 8 micro-batches of 1 (ZeRO-3 under
    a torchtitan stack, which shards with FSDP2)."""
    cfg = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8},
           "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                        "pipeline_model_parallel_size": 4, "data_parallel_size": 1},
           "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": seq,
                     "recompute": "full"},
           "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}
    if stack.startswith("torchtitan"):
        cfg["parallel"]["zero_stage"] = 3
    return cfg


def assert_search_memory_is_exact(monkeypatch, cfg: dict, **rule) -> None:
    """Switch ``rule`` (fields of Megatron's :data:`FRAMEWORKS` entry) on and compare the
    search tier's memory with :func:`ddlsim.memory_per_device` plan by plan (rel 1e-12).

    ``cfg`` is a Megatron-Core config of 8 devices with TP 2."""
    from ddlsim.search.family import vector_family
    from ddlsim.search.plans import VECTOR_FIELDS, enumerate_plans
    monkeypatch.setitem(FRAMEWORKS, "megatron", dataclasses.replace(FRAMEWORKS["megatron"],
                                                                    **rule))
    run = ddlsim.load_config(cfg)
    base = {p: getattr(getattr(run, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    base["parallel.schedule"] = run.parallel.schedule
    pps = [2, 4]
    plans = enumerate_plans({"parallel.pipeline_model_parallel_size": pps}, base,
                            run.system.num_devices)
    family = vector_family(run.model.architecture)
    memory, _ = family.memory(family.prepare(run), plans)
    for k, pp in enumerate(pps):
        one = {**cfg, "parallel": {**cfg["parallel"], "pipeline_model_parallel_size": pp,
                                   "data_parallel_size": 8 // (2 * pp)}}
        exact = ddlsim.memory_per_device(ddlsim.load_config(one)).total
        assert memory[k] == pytest.approx(exact, rel=1e-12)
