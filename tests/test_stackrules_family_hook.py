"""The stack rules read a plan's MoE options through the family registry
(WorkloadFamily.moe_plan), and a stack without MoE code settles the overlap options by its
rule that refuses them."""

import ddlsim.stackrules as stackrules
from ddlsim.configload import build_config
from ddlsim.workloads.registry import WorkloadFamily, get_family
from ddlsim.workloads.decoder.moeplan import resolve_moe

_MOE = {"token_dispatcher_type": "alltoall", "grouped_gemm": False, "permute_fusion": False}


def _mixtral(stack: str | dict, moe: dict) -> dict:
    return {"model": "mixtral-8x7b", "parallel": {"moe": moe},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
            "system": {"preset": "dgx-h100", "nodes": 2, "software": stack}}


def test_stackrules_asks_the_family_not_the_decoder_package():
    import ast
    import importlib
    import inspect
    import pkgutil
    modules = [stackrules] + [importlib.import_module(f"{stackrules.__name__}.{m.name}")
                              for m in pkgutil.iter_modules(stackrules.__path__)]
    assert len(modules) > 1     # the package's modules (facts, definitions, checks)
    imported = {n.module for mod in modules for n in ast.walk(ast.parse(inspect.getsource(mod)))
                if isinstance(n, ast.ImportFrom)}
    assert not any(m and "decoder" in m for m in imported), imported


#: DeepSpeed v0.3.13 has no MoE code (rule no_moe): its MoE plans are what-ifs
_DS2021_WHAT_IF = {"stack": "deepspeed-2021", "what_if": True}


def test_default_hook_has_no_moe_plan_and_decoder_resolves_it():
    cfg = build_config(_mixtral(_DS2021_WHAT_IF, _MOE), [])
    assert WorkloadFamily.moe_plan(get_family("bert"), cfg) is None
    assert get_family(cfg.model.architecture).moe_plan(cfg) == resolve_moe(cfg)


def test_stack_without_moe_code_runs_no_overlap_citing_its_rule():
    plan = resolve_moe(build_config(_mixtral(_DS2021_WHAT_IF, _MOE), []))
    assert plan.a2a_overlap is False and plan.delay_wgrad is False
    assert "v0.5.0" in plan.sources["overlap_expert_parallel_comm"]
    assert plan.sources["token_dispatcher_type"] == "parallel.moe.token_dispatcher_type"


def test_turning_the_overlap_on_is_still_refused_by_that_rule():
    import pytest
    from ddlsim.errors import ConfigError
    moe = {**_MOE, "overlap_expert_parallel_comm": True}
    with pytest.raises(ConfigError, match="no_ep_a2a_overlap"):
        build_config(_mixtral("deepspeed-2021", moe), [])
