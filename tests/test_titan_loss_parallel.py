"""torchtitan's loss under TP (loss_parallel, torch/distributed/tensor/parallel/loss.py): the
backward's fused nll_loss + log_softmax backward holds four fp32 tensors per logit at once
(the saved log-softmax, zeros_like(x), exp(x), their sum / its product with the gradient):
16 B, above the forward's 2 + 3 x 4 B. Without TP the eager rule (12 B) stands; a compiled
loss (torchtitan 2025) keeps its own rule. Bytes by hand."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.framework_memory import FRAMEWORKS

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


@pytest.mark.parametrize("name", ["torchtitan", "torchtitan-2025"])
def test_bytes_per_logit_with_and_without_tp(name):
    fm = FRAMEWORKS[name]
    assert fm.logits_at(8) == 4 + 4 + 4 + 4
    assert fm.logits_at(1) == 4 + 4 + 4
    assert "_nll_loss_and_log_softmax_backward" in fm.sources["logit_bytes_tp"]


def _other(tp: int) -> float:
    """llama-3.1-8b cut to 2 layers, FSDP2 over 8 / tp ranks, micro-batch 1 of 4,096 tokens:
    the loss's and the head's bytes (``other``)."""
    cfg = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
           "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1,
                        "data_parallel_size": 8 // tp, "zero_stage": 3},
           "train": {"micro_batch_size": 1, "global_batch_size": 8 // tp, "seq_length": 4096,
                     "recompute": "full"},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "torchtitan-2024"}}}
    return ddlsim.memory_per_device(ddlsim.load_config(cfg)).other


def test_the_loss_under_tp_counts_16_bytes_per_logit_of_the_rank():
    s, h, v = 4096, 4096, 128256
    head = s * 2 * h * (2 / 2 + 1)          # the final norm's and the head's kept tensors, TP 2
    assert _other(2) == pytest.approx(16 * s * v / 2 + head, rel=1e-12)
