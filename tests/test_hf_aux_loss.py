"""A HuggingFace ``config.json``'s ``router_aux_loss_coef`` is read, not ignored: where the
file trains with the loss (``output_router_logits: true``, transformers' condition for adding
it) it is ``parallel.moe.aux_loss_coeff``'s default (as the Megatron importer maps
``--moe-aux-loss-coeff``), under aux_loss/seq_aux_loss balancing; the published files leave
``output_router_logits`` false, so they train without it; a coefficient the plan gives always
wins."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder.moeplan import resolve_moe

BASE = {"model": {"hf_config": "mixtral-8x7b-v0.1", "num_hidden_layers": 2},
        "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                     "expert_model_parallel_size": 4},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
        "system": {"preset": "dgx-h100", "nodes": 1}}


def load(moe: dict | None = None, model: dict | None = None) -> tuple[ddlsim.RunConfig, list]:
    d = copy.deepcopy(BASE)
    d["model"].update(model or {})
    if moe is not None:
        d["parallel"]["moe"] = moe
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config(d)
    return cfg, [str(w.message) for w in caught]


def _with_logits(tmp_path) -> dict:
    """mixtral-8x7b-v0.1.json as published but with ``output_router_logits: true``."""
    from ddlsim.workloads.registry import _hf_document
    doc, _ = _hf_document("mixtral-8x7b-v0.1", None)
    assert doc["output_router_logits"] is False and doc["router_aux_loss_coef"] == 0.02
    doc["output_router_logits"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return {"hf_config": str(path)}


def test_the_published_file_trains_without_the_loss():
    cfg, messages = load()      # "router_aux_loss_coef": 0.02, "output_router_logits": false
    assert cfg.model.router_aux_loss_coef is None
    assert not any("router_aux_loss_coef" in m for m in messages)
    plan = resolve_moe(cfg)
    assert plan.aux_loss_coeff == 0.0


def test_the_files_coefficient_is_read_when_it_trains_with_the_loss(tmp_path):
    cfg, messages = load(model=_with_logits(tmp_path))
    assert cfg.model.router_aux_loss_coef == 0.02
    assert not any("router_aux_loss_coef" in m for m in messages)
    plan = resolve_moe(cfg)
    assert plan.aux_loss_coeff == 0.02 and plan.aux_loss
    assert plan.sources["aux_loss_coeff"] == "model.router_aux_loss_coef"


@pytest.mark.parametrize("given", [0.0, 0.5])
def test_the_plans_coefficient_wins(given):
    plan = resolve_moe(load({"aux_loss_coeff": given})[0])
    assert plan.aux_loss_coeff == given
    assert plan.sources["aux_loss_coeff"] == "parallel.moe.aux_loss_coeff"


def test_balancing_without_a_loss_takes_no_coefficient_from_the_file(tmp_path):
    plan = resolve_moe(load({"router_load_balancing_type": "none"}, _with_logits(tmp_path))[0])
    assert plan.aux_loss_coeff == 0.0 and not plan.aux_loss


def test_the_loss_is_charged(tmp_path):
    model = _with_logits(tmp_path)
    with_loss = ddlsim.predict(load(model=model)[0], check_fit=False).iteration_time_s
    without = ddlsim.predict(load({"aux_loss_coeff": 0.0}, model=model)[0],
                             check_fit=False).iteration_time_s
    assert with_loss > without


@pytest.mark.parametrize("bad", [-0.1, "0.02", True])
def test_a_bad_coefficient_in_the_file_names_the_key(tmp_path, bad):
    from ddlsim.workloads.registry import _hf_document
    doc, _ = _hf_document("mixtral-8x7b-v0.1", None)
    doc["router_aux_loss_coef"] = bad
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="router_aux_loss_coef"):
        load(model={"hf_config": str(path)})


def test_a_dense_file_warns_that_the_key_does_nothing(tmp_path):
    from ddlsim.workloads.registry import _hf_document
    doc, _ = _hf_document("mixtral-8x7b-v0.1", None)
    doc.update(model_type="llama", router_aux_loss_coef=0.02)
    for key in ("num_local_experts", "num_experts_per_tok"):
        doc.pop(key)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    d = copy.deepcopy(BASE)
    d["model"] = {"hf_config": str(path), "num_hidden_layers": 2}
    d["parallel"] = {"tensor_model_parallel_size": 2}
    with pytest.warns(ddlsim.errors.DDLSimWarning, match="router_aux_loss_coef=0.02 .*no experts"):
        cfg = ddlsim.load_config(d)
    assert cfg.model.router_aux_loss_coef is None
