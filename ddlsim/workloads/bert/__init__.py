"""BERT encoders with their pre-training heads: the ``bert`` workload family.

Data parallel (PyTorch DDP buckets) or pipeline + data parallel, as the DNN-cpp-proxies
``bert_large`` proxy runs it. The model section and parameter/FLOP counts are in
:mod:`.schema`, the trace and memory in :mod:`.build`, presets in ``data/bert.yaml``. See
``docs/workloads/bert.md``.
"""

from __future__ import annotations

from typing import Any

from ..registry import BASE_PLAN_FIELDS, WorkloadFamily, batch_phrase, register_workload
from .schema import BertModel

__all__ = ["BertFamily", "BertModel"]


@register_workload("bert")
class BertFamily(WorkloadFamily):
    """BERT-base and BERT-large (presets in ``data/bert.yaml``)."""

    schema = BertModel
    #: the plan fields its rules and trace read (any other is refused when set)
    plan_fields = (*BASE_PLAN_FIELDS, "parallel.virtual_pipeline_model_parallel_size",
                   "parallel.schedule", "parallel.overlap_grad_reduce",
                   "parallel.grad_bucket_size")
    presets_file = "bert.yaml"

    def check(self, cfg: Any) -> None:
        """Pipeline + data parallel with DDP; whole layers per stage; the sequence fits."""
        m, p, t = cfg.model, cfg.parallel, cfg.train
        if p.tp > 1 or p.ep > 1 or p.vpp > 1:
            raise ValueError(
                f"the bert family runs pipeline + data parallel: tensor_model_parallel_size = "
                f"{p.tp}, expert_model_parallel_size = {p.ep} and "
                f"virtual_pipeline_model_parallel_size = {p.vpp} must be 1")
        if p.dp_strategy != "ddp" or p.zero_stage != 0:
            raise ValueError(f"the bert family models PyTorch DDP: dp_strategy = "
                             f"{p.dp_strategy!r} and zero_stage = {p.zero_stage} must be 'ddp' "
                             "and 0")
        if m.num_hidden_layers % p.pp:
            raise ValueError(f"model.num_hidden_layers = {m.num_hidden_layers} is not divisible "
                             f"by pipeline_model_parallel_size = {p.pp}: each stage holds whole "
                             "layers")
        if t.seq_length > m.max_position_embeddings:
            raise ValueError(f"train.seq_length = {t.seq_length} exceeds "
                             f"model.max_position_embeddings = {m.max_position_embeddings}")
        if m.grad_buckets != "ddp" and "grad_bucket_size" in p.model_fields_set:
            raise ValueError(f"parallel.grad_bucket_size is DDP's bucket_cap_mb, but "
                             f"model.grad_buckets = {m.grad_buckets!r} sets the buckets; remove "
                             "one")
        if m.p2p_attention_mask and p.pp == 1:
            raise ValueError("model.p2p_attention_mask = true describes pipeline messages, but "
                             "pipeline_model_parallel_size = 1 sends none; remove it or use "
                             "pp > 1")
        if m.stage_exchange == "paired" and p.pp == 1:
            raise ValueError("model.stage_exchange = 'paired' describes pipeline messages, but "
                             "pipeline_model_parallel_size = 1 sends none; remove it or use "
                             "pp > 1")

    def build(self, cfg: Any):
        from .build import build_bert
        return build_bert(cfg)

    def memory(self, cfg: Any) -> list:
        from .build import bert_memory
        return bert_memory(cfg)

    def plan_summary(self, cfg: Any) -> str:
        """``DP32 = 32 ranks`` or ``PP4 × DP8 = 32 ranks, gpipe``, the gradient buckets,
        the batch, the sequence and the dtype."""
        from ..resnet import bucket_phrase

        m, p, t = cfg.model, cfg.parallel, cfg.train
        axes = f"PP{p.pp} × DP{cfg.dp}" if p.pp > 1 else f"DP{cfg.dp}"
        plan = f"{axes} = {cfg.world_size} ranks" + (f", {p.schedule}" if p.pp > 1 else "")
        buckets = "one bucket per layer" if m.grad_buckets == "per_layer" else \
            bucket_phrase("ddp", p)
        when = "overlapped" if cfg.software.overlap_grad_reduce else "after the backward"
        return (f"{plan}, {buckets}, all-reduce {when}, {batch_phrase(cfg)}, "
                f"seq {t.seq_length}, {t.dtype}")

    def summary(self, model: Any) -> str:
        return model.summary_line()
