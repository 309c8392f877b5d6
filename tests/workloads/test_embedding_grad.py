"""The input embedding's backward (ddlsim/workloads/decoder/embedding_grad.py): torch's dense
``V_local × h`` gradient (zero fill, then the token rows summed in), Megatron's mask under TP,
and the stack's accumulation of it, with a tied weight's two gradients summed on a PP = 1 rank.
Bytes by hand; where the builder puts the op; the engines charge it.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.embedding_grad import SMALL_LOOKUP_TOKENS, embedding_backward_op
from ddlsim.workloads.trace import Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

V, H = 131072, 2048          # the 1.7B row of validate_megatron_h100 (vocabulary, hidden)


def _run(stack: str = "megatron-core-2024", pp: int = 1, tp: int = 1, tied: bool = True,
         seq: int = 4096, fusion: bool | None = None) -> dict:
    kernels = {} if fusion is None else {"gradient_accumulation_fusion": fusion}
    return {"model": {"num_hidden_layers": 4, "hidden_size": H, "num_attention_heads": 16,
                      "vocab_size": V, "max_position_embeddings": 4096,
                      "tie_word_embeddings": tied},
            "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": seq},
            "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 8,
                       "software": {"stack": stack, "kernels": kernels}}}


def _sw(**kw):
    return ddlsim.load_config(_run(**kw)).software


def test_untied_megatron_bytes_by_hand():
    # 4,096 tokens (> 3,072: sorted path): zero fill V·h·2; rows read + fp32 partials written,
    # partials read + rows written; the hook's main_grad.add_: read 2, read and write fp32 4
    op = embedding_backward_op(4096, V, H, 2, 4, "bf16", _sw(tied=False), 1, False)
    rows = 4096 * H * (2 + 4)
    assert [k.bytes for k in op.kernels] == [V * H * 2, rows, rows, V * H * (2 + 2 * 4)]
    assert op.bytes == V * H * 12 + 2 * rows and op.kind == "elementwise"


def test_few_tokens_take_torchs_unsorted_kernel():
    n = SMALL_LOOKUP_TOKENS
    op = embedding_backward_op(n, V, H, 2, 4, "bf16", _sw(tied=False), 1, False)
    assert [k.bytes for k in op.kernels] == [V * H * 2, 3 * n * H * 2, V * H * 10]


def test_vocab_parallel_mask_backward():
    # TP 4: the output gradient cloned (read + write) and the 3/4 of rows of other shards zeroed
    op = embedding_backward_op(4096, V / 4, H, 2, 4, "bf16", _sw(tied=False), 4, False)
    assert [k.bytes for k in op.kernels][3:5] == [2 * 4096 * H * 2, 0.75 * 4096 * H * 2]


@pytest.mark.parametrize("fusion", [True, False])
def test_tied_weight_on_one_stage_sums_two_gradients(fusion):
    # autograd sums the head's and the embedding's gradients (3 passes of V·h·2); with the
    # fusion the head hands a zero-filled dummy (zero_out_wgrad) and the hook adds the sum
    # into main_grad here; without it the head's own accumulation op adds it (not again here)
    sw = _sw(fusion=fusion)
    untied = embedding_backward_op(4096, V, H, 2, 4, "bf16", sw, 1, False)
    tied = embedding_backward_op(4096, V, H, 2, 4, "bf16", sw, 1, True)
    hook = V * H * 10
    extra = (V * H * 2 + 3 * V * H * 2) if fusion else (3 * V * H * 2 - hook)
    assert tied.bytes == pytest.approx(untied.bytes + extra)


def test_the_first_stage_alone_runs_it_after_its_layers():
    # PP 2 × DP 4: stage 0's backward ends with it; where the buckets overlap the backward
    # (.sync), the last bucket's collective waits for it (the embedding is the last bucket's)
    w = ddlsim.build_workload(ddlsim.load_config(_run(pp=2, tied=False)))
    for cls, has in zip(w.classes, (True, False)):
        blocks = cls.program.blocks
        names = [op.payload.name for op in blocks["B0"].flat.ops]
        assert ("bwd.embedding" in names) is has
        if has:
            assert names[-1] == "bwd.embedding"
            ops = blocks["B0.sync"].flat.ops
            synced = [o.payload.name for o in ops]
            i = synced.index("bwd.embedding")
            last = max(j for j, o in enumerate(ops) if o.stream == "dp")
            assert i > max(j for j, n in enumerate(synced) if n == "bwd.grad_accumulate")
            assert i < last and ops[last].deps[0] > i


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_pp1_tied_variant_is_built_and_charged(engine, monkeypatch):
    # PP 1 with tied weights: the builder asks for the sum of both gradients, and each
    # micro-batch's iteration grows by at least the op's traffic at the datasheet bandwidth
    from ddlsim.workloads.decoder.edges import EdgeOps
    cfg = ddlsim.load_config(_run())
    w = ddlsim.build_workload(cfg)
    ops = [op.payload for op in w.classes[0].program.blocks["B0"].flat.ops
           if type(op.payload) is Compute and op.payload.name == "bwd.embedding"]
    op = embedding_backward_op(4096, V, H, 2, 4, "bf16", cfg.software, 1, True)
    assert ops == [op]
    with_op = ddlsim.predict(cfg, engine=engine).iteration_time_s
    monkeypatch.setattr(EdgeOps, "embedding_backward", lambda self, with_head=None: [])
    without = ddlsim.predict(ddlsim.load_config(_run()), engine=engine).iteration_time_s
    microbatches = 1   # global batch 8, micro-batch 1, DP 8
    floor = op.bytes / cfg.system.device.memory_bandwidth_Bps
    assert with_op - without >= microbatches * floor


@pytest.mark.parametrize("stack", ["megatron-core-2024", "torchtitan-2024"])
def test_fsdp_root_unit_computes_it_in_both_tiers(stack, monkeypatch):
    # ZeRO-3 with FSDP's root unit (FSDP1 / torchtitan 9dec370): the embedding's backward is
    # the root unit's compute, before its reduce-scatter; one node, so it is exposed, and the
    # search tier's recurrence (search/zero3.py) times it as the exact engine does
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    from ddlsim.workloads.decoder import fsdp2_host
    from ddlsim.workloads.decoder.edges import EdgeOps

    data = _run(stack=stack, tied=False)
    data["parallel"] = {"zero_stage": 3}
    if stack == "megatron-core-2024":   # its ZeRO-3 (FSDP1) as a what-if: rule no_zero3
        data["system"]["software"]["what_if"] = True
    # FSDP2 (torchtitan) on a GPU: the root unit's post-backward fills _chunk_cat's metadata
    # on the host (537 M gradients: 4.0 ms on dgx-h100), which the device waits for after
    # the unit; the embedding's backward (0.2 ms) runs inside that wait, hidden. Without the
    # metadata the root unit's end is the device's, and the op it computes lengthens the step
    monkeypatch.setattr(fsdp2_host, "CHUNK_CAT_HOST_TINY_OPS", 0.0)

    def both() -> tuple[float, float]:
        exact = ddlsim.predict(ddlsim.load_config(data), check_fit=False).iteration_time_s
        frame = evaluate_grid(data, None, [], {"parallel.zero_stage": [3]}, Constraints()).frame
        return float(frame["iteration_time_s"].iloc[0]), exact

    ops = [o.payload.name for o in ddlsim.build_workload(
        ddlsim.load_config(data)).classes[0].program.blocks["B0"].flat.ops]
    # the root unit's reduce-scatter is the backward's last collective; FSDP1 (megatron-core-2024's
    # ZeRO-3) follows it with its post-backward passes and the final wait on that stream
    tail = ops[ops.index("grad.reduce_scatter.root") + 1:]
    assert tail == ([] if stack == "torchtitan-2024" else ["zero3.after_reduce", "fsdp1.post_backward"])
    assert ops.index("bwd.embedding") > max(i for i, n in enumerate(ops) if n == "bwd.attn")
    search, exact = both()
    assert search == pytest.approx(exact, rel=1e-9)
    monkeypatch.setattr(EdgeOps, "embedding_backward", lambda self, with_head=None: [])
    search0, exact0 = both()
    assert search0 == pytest.approx(exact0, rel=1e-9) and exact > exact0 * 1.001
