"""The decoder builder's memos change no output: the head's kernels and loss op
(:func:`~ddlsim.workloads.decoder.layerkernels.logits_kernels`, :func:`~ddlsim.workloads.
decoder.layerkernels.loss_op`, memoised by their arguments) equal a fresh computation, an int
and a float argument stay apart, and a search grid's frame is the same with the memos cold
or warm."""

from __future__ import annotations

from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.netcost import cache_clear
from ddlsim.search.spec import Constraints
from ddlsim.workloads.decoder import layerkernels as lk

GPT2 = {"model": "gpt2-124m", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2, 4],
        "parallel.pipeline_model_parallel_size": [1, 2],
        "parallel.sequence_parallel": [False, True],
        "train.micro_batch_size": [1, 2],
        "train.recompute": ["none", "selective", "full"]}


def _clear_memos() -> None:
    for f in (lk.layer_kernels, lk.logits_kernels, lk.loss_op, lk.final_norm_op):
        f.cache_clear()


def test_head_memo_equals_a_fresh_computation():
    for backward in (False, True):
        args = (4096, 50304 / 4, 1024, "bf16")
        assert lk.logits_kernels(*args, backward) == lk.logits_kernels.__wrapped__(*args,
                                                                                  backward)
        assert lk.logits_kernels(*args, backward) is lk.logits_kernels(*args, backward)
        loss = (4096, 50304 / 4, 2, "bf16", True, backward)
        assert lk.loss_op(*loss) == lk.loss_op.__wrapped__(*loss)


def test_head_memo_keeps_an_int_and_a_float_apart():
    _clear_memos()
    a = lk.loss_op(4096, 12576.0, 2, "bf16", False, False)
    b = lk.loss_op(4096.0, 12576.0, 2, "bf16", False, False)
    assert lk.loss_op.cache_info().currsize == 2
    assert a == lk.loss_op.__wrapped__(4096, 12576.0, 2, "bf16", False, False)
    assert b == lk.loss_op.__wrapped__(4096.0, 12576.0, 2, "bf16", False, False)


def test_search_frame_is_the_same_with_memos_cold_or_warm():
    frames = []
    for _ in range(2):   # the first run with every memo cleared, the second warm
        if not frames:
            _clear_memos()
        cache_clear()
        frames.append(evaluate_grid(GPT2, None, [], AXES, Constraints()).frame)
    assert len(frames[0]) > 10
    assert frames[0].equals(frames[1])
