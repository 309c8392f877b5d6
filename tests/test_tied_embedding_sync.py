"""The tied word embedding's gradient all-reduce between the first and last pipeline stages
(workloads/decoder/tied_embedding.py): charged on those two stages of a tied plan with PP > 1
only, over the two-rank ``embedding`` group, before the optimizer step, bytes by hand on
GPT-2 124M (vocabulary 50,257, hidden 768: its config.json) with TP 2."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.decoder import tied_embedding
from ddlsim.workloads.decoder.tied_embedding import GROUP, OP_NAME, insert_op
from ddlsim.workloads.trace import Collective, Compute, Op, Wait

BASE = {"model": {"preset": "gpt2-124m"},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
                     "data_parallel_size": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024,
                  "dtype": "bf16"},
        "system": {"preset": "dgx-h100", "nodes": 2}}
#: the rank's V·h/t embedding gradient elements (GPT-2: V 50,257, h 768; TP 2)
ELEMENTS = 50257 * 768 / 2


def config(pp=4, tied=True, dtype="bf16", stack=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(pipeline_model_parallel_size=pp, **parallel)
    d["parallel"]["data_parallel_size"] = 16 // (d["parallel"]["tensor_model_parallel_size"] * pp)
    d["train"]["dtype"] = dtype
    if not tied:
        d["model"]["tie_word_embeddings"] = False
    if stack:
        d["system"]["software"] = stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def tied_ops(cfg) -> dict[str, list]:
    """Per rank class, its update block's embedding-gradient all-reduces."""
    w = build_workload(cfg)
    return {c.name: [o for o in c.program.blocks["update"].ops if o.payload.name == OP_NAME]
            for c in w.classes}


def test_charged_on_the_first_and_last_stage_in_the_stacks_gradient_dtype():
    """bf16 under Megatron-Core 2024 (grad_reduce_dtype fp32_if_bf16): fp32 main_grad, 4 B an
    element; fp16: 2 B. Middle stages hold no copy and run none."""
    for dtype, nbytes in (("bf16", 4), ("fp16", 2)):
        ops = tied_ops(config(dtype=dtype))
        assert [len(v) for v in ops.values()] == [1, 0, 0, 1]
        for name in ("stage0", "stage3"):
            p = ops[name][0].payload
            assert (p.op, p.group, p.bytes) == ("all_reduce", GROUP, ELEMENTS * nbytes)
            assert ops[name][0].stream == "compute"


def test_megatron_lm_2021_all_reduces_its_main_grad_too():
    """Megatron-LM 6985e58 training.py: the same all-reduce of main_grad (fp32 with bf16)."""
    ops = tied_ops(config(stack="megatron-lm-2021"))
    assert ops["stage0"][0].payload.bytes == ELEMENTS * 4
    assert ops["stage3"][0].payload.bytes == ELEMENTS * 4


def test_the_group_pairs_each_pipelines_first_and_last_rank():
    """Megatron's rank order rank = t + T·(d + D·s): TP 2, DP 2, PP 4 → (t + 2d, t + 2d + 12)."""
    fam = build_workload(config()).groups[GROUP]
    assert fam.kind == "pp"
    assert fam.members.tolist() == [[0, 12], [1, 13], [2, 14], [3, 15]]


def test_it_runs_after_the_gradient_sync_and_before_the_step():
    ops = build_workload(config()).classes[-1].program.blocks["update"].ops
    names = [o.payload.name for o in ops]
    at = names.index(OP_NAME)
    assert names.index("wait.grad") < at < names.index("optimizer")
    assert names[at + 1] in ("grad_norm.sync", "optimizer")


@pytest.mark.parametrize("pp, tied", [(1, True), (4, False), (2, False)])
def test_absent_at_pp1_and_when_untied(pp, tied):
    w = build_workload(config(pp=pp, tied=tied))
    assert GROUP not in w.groups
    assert not any(o.payload.name == OP_NAME for c in w.classes
                   for o in c.program.blocks["update"].ops)


def test_pp2_group_is_the_pipeline_group():
    w = build_workload(config(pp=2))
    assert w.groups[GROUP].members.tolist() == w.groups["pp"].members.tolist()


def test_both_engines_charge_it_alike(monkeypatch):
    """The analytical engine and the DES time the same trace, the op included; it adds its
    bytes to the pipeline kind's traffic and makes the iteration longer."""
    cfg = config()
    a = ddlsim.predict(cfg, engine="analytical")
    d = ddlsim.predict(cfg, engine="des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=2e-3)
    monkeypatch.setattr(tied_embedding, "charged", lambda shape, pp, mtp=0: False)
    without = ddlsim.predict(cfg, engine="analytical")
    assert a.comm_bytes["pp"] - without.comm_bytes["pp"] == ELEMENTS * 4
    assert a.iteration_time_s > without.iteration_time_s


def test_insert_op_shifts_later_dependencies():
    ops = (Op(Wait("w", "compute")), Op(Collective("c", "all_reduce", "dp", 8.0),
                                         stream="dp", deps=(0,)),
           Op(Compute("x", 1.0)), Op(Collective("g", "all_gather", "dp", 8.0), stream="dp",
                                     deps=(2,)))
    new = Op(Compute("new", 1.0))
    out = insert_op(ops, 2, new)
    assert [o.payload.name for o in out] == ["w", "c", "new", "x", "g"]
    assert out[1].deps == (0,) and out[4].deps == (3,)


@pytest.mark.filterwarnings("ignore")
def test_search_tier_charges_it_as_the_exact_engine(monkeypatch):
    """The vectorised tier's meeting of the first and last stages (search/pipeline.py,
    StageCosts.tied_sync) follows the exact engine at PP 2 and 4 to the agreement target
    (1 %); without the charge in the search tier alone it misses the exact engine by more."""
    from ddlsim.config import build_config
    from ddlsim.search import decoder as search_decoder
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints

    data = {**BASE, "model": "gpt3-1.3b",
            "train": {**BASE["train"], "seq_length": 2048, "global_batch_size": 16},
            "system": {"preset": "dgx-h100", "nodes": 2}}
    axes = {"parallel.tensor_model_parallel_size": [2],
            "parallel.pipeline_model_parallel_size": [2, 4]}

    def frame():
        f = evaluate_grid(data, None, [], axes, Constraints()).frame
        return f, [c for c in f.columns if "." in c]

    got, columns = frame()
    exact = [ddlsim.predict(build_config(data, plan_overrides(got.iloc[i], columns)),
                            check_fit=False).iteration_time_s for i in range(len(got))]
    assert len(got) == 2
    assert got["iteration_time_s"].tolist() == pytest.approx(exact, rel=0.01)
    monkeypatch.setattr(search_decoder, "_tied_on",
                        lambda ctx, plans: np.zeros(len(plans), dtype=bool))
    without, _ = frame()
    err = np.abs(without["iteration_time_s"].to_numpy() / np.array(exact) - 1)
    assert err.max() > 0.01, err


def test_reduce_to_root_all_reduces_between_the_roots_only():
    """reduce_broadcast: only DP rank 0 of each stage steps, so only the roots' pair meets
    (the family holds their group alone, and both engines share the links among it)."""
    cfg = config(pp=2, dp_strategy="reduce_broadcast", tensor_model_parallel_size=1)
    w = build_workload(cfg)
    assert w.groups[GROUP].members.tolist() == [[0, 8]]
    ops = tied_ops(cfg)
    assert [len(ops[n]) for n in ("stage0.root", "stage0.rest", "stage1.root",
                                  "stage1.rest")] == [1, 0, 1, 0]
    a = ddlsim.predict(cfg, engine="analytical").iteration_time_s
    assert ddlsim.predict(cfg, engine="des").iteration_time_s == pytest.approx(a, rel=2e-3)


def test_bert_tied_at_pp2_keeps_a_copy_and_all_reduces_it():
    """The bert family at PP 2 with its MLM decoder tied: the last stage holds a copy of the
    word embeddings (its gradients are those of the same model untied, whose decoder has the
    same size) and both stages all-reduce its gradient, V·h in bf16, before the step."""
    from ddlsim.workloads.bert.build import stage_buckets
    model = {"architecture": "bert", "name": "bert-small", "num_hidden_layers": 4,
             "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 30522}
    doc = {"model": model,
           "parallel": {"data_parallel_size": 2, "pipeline_model_parallel_size": 2},
           "train": {"micro_batch_size": 4, "global_batch_size": 32, "seq_length": 128,
                     "dtype": "bf16"},
           "system": {"preset": "dgx-a100", "nodes": 1}}
    tied = ddlsim.load_config(doc)
    untied = ddlsim.load_config({**doc, "model": {**model, "tie_word_embeddings": False}})
    # the last stage's gradients: the copy where the untied decoder would be
    assert stage_buckets(tied, 1)[0] == stage_buckets(untied, 1)[0]
    w = build_workload(tied)
    assert w.groups[GROUP].members.tolist() == w.groups["pp"].members.tolist()
    for c in w.classes:
        ops = [o.payload for o in c.program.blocks["update"].ops]
        names = [p.name for p in ops]
        assert names.index(OP_NAME) < names.index("optimizer")
        assert ops[names.index(OP_NAME)].bytes == 2 * 30522 * 256
    assert GROUP not in build_workload(untied).groups
    a = ddlsim.predict(tied, engine="analytical").iteration_time_s
    assert ddlsim.predict(tied, engine="des").iteration_time_s == pytest.approx(a, rel=0.01)
    assert a > ddlsim.predict(untied, engine="analytical").iteration_time_s
