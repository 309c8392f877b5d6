"""DLRM, the deep-learning recommendation model: the ``dlrm`` workload family.

Embedding tables sharded over every rank (table-, row- or column-wise) and exchanged with an
all-to-all (or a reduce-scatter / all-gather for row-wise shards), bottom and top MLPs
replicated and trained data-parallel, a dot-product, concatenation or DCN-v2 interaction.
Model section: :mod:`.schema`; counts: :mod:`.shape`; trace and memory: :mod:`.build`;
presets: ``ddlsim/data/dlrm.yaml``; documentation: ``docs/workloads/dlrm.md``.

References
----------
Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", arXiv:1906.00091. Wang et al. 2021, "DCN V2", arXiv:2008.13535.
facebookresearch/dlrm ``dlrm_s_pytorch.py``; pytorch/torchrec ``torchrec/models/dlrm.py``.
"""

from __future__ import annotations

from typing import Any

from ..registry import BASE_PLAN_FIELDS, WorkloadFamily, batch_phrase, register_workload
from .schema import DLRMModel

__all__ = ["DLRMFamily", "DLRMModel"]


def _world(cfg: Any) -> int:
    p = cfg.parallel
    return p.data_parallel_size or cfg.system.num_devices // (p.tp * p.pp)


@register_workload("dlrm")
class DLRMFamily(WorkloadFamily):
    """Embedding tables model-parallel over all ranks, MLPs data-parallel."""

    schema = DLRMModel
    #: the plan fields its rules and trace read (any other is refused when set)
    #: a sample is one row of features: train.seq_length is 1 where the config leaves it out
    sample_length = 1
    plan_fields = (*BASE_PLAN_FIELDS, "parallel.overlap_grad_reduce", "train.recompute",
                   "parallel.collective_buffers")
    presets_file = "dlrm.yaml"

    def check(self, cfg: Any) -> None:
        """The plan must be data-parallel only; shards must divide as the sharding needs."""
        p, t = cfg.parallel, cfg.train
        if p.tp > 1 or p.pp > 1 or p.ep > 1:
            raise ValueError(f"the dlrm family shards embeddings over every rank and replicates "
                             f"the MLPs (data parallel): tensor_model_parallel_size = {p.tp}, "
                             f"pipeline_model_parallel_size = {p.pp} and "
                             f"expert_model_parallel_size = {p.ep} must all be 1")
        if p.zero_stage or p.dp_strategy != "ddp":
            raise ValueError(f"the dlrm family models a DDP gradient all-reduce of the MLPs; "
                             f"zero_stage = {p.zero_stage} and dp_strategy = "
                             f"{p.dp_strategy!r} are not modelled for it: use 0 and 'ddp'")
        if t.seq_length != 1 or t.recompute != "none":
            raise ValueError(f"a DLRM sample is one row of features: train.seq_length = "
                             f"{t.seq_length} must be 1 and train.recompute = {t.recompute!r} "
                             "must be 'none'")
        _check_sharding(cfg.model, _world(cfg))

    def build(self, cfg: Any):
        from .build import build_dlrm_workload
        return build_dlrm_workload(cfg)

    def memory(self, cfg: Any) -> list:
        from .build import dlrm_memory
        return dlrm_memory(cfg)

    def summary(self, model: Any) -> str:
        """``name: T tables (rows), dim, MLPs, interaction, sharding, parameters``."""
        from .shape import DLRMShape

        sh = DLRMShape(model)
        inter = (f"DCN-v2 ×{model.cross_layers}" + (f" rank {model.low_rank}"
                                                    if model.low_rank else "")
                 if model.interaction == "dcnv2" else model.interaction)
        rows = sum(t.rows for t in model.tables)
        return (f"{model.name}: DLRM, {len(model.tables)} tables ({rows:,} rows, dim "
                f"{'/'.join(map(str, sorted(set(sh.dims))))}), bottom "
                f"{'-'.join(map(str, [model.dense_features, *model.bottom_mlp]))}, top "
                f"{'-'.join(map(str, [sh.interaction_out, *model.top_mlp]))}, {inter}, "
                f"{model.sharding}, {sh.params / 1e6:,.1f} M params")

    def plan_summary(self, cfg: Any) -> str:
        """``4 ranks: embeddings table_wise over all, MLPs DP4``, how the exchanges overlap,
        the batch and the dtype."""
        m, p = cfg.model, cfg.parallel
        a2a = "overlapped" if m.overlap_embedding_all_to_all else "not overlapped"
        grads = "overlapped" if cfg.software.overlap_grad_reduce else "after the backward"
        return (f"{cfg.world_size} ranks: embeddings {m.sharding} over all of them "
                f"(exchange {a2a}), MLPs DP{cfg.dp} (gradient all-reduce {grads}), "
                f"{batch_phrase(cfg, 'rank')}, {cfg.train.dtype}")

    def group_labels(self, cfg: Any) -> dict[str, str]:
        """``world``: the embedding exchange; ``dp``: the MLP gradients."""
        return {"world": "world (embedding exchange)", "dp": "dp (MLP gradients)"}


def _check_sharding(model: DLRMModel, p: int) -> None:
    """Column-wise: every table's dim divisible by the rank count."""
    if model.sharding == "column_wise":
        bad = sorted({d for d in (model.dim_of(t) for t in model.tables) if d % p})
        if bad:
            raise ValueError(f"model.sharding = 'column_wise' splits every table's columns over "
                             f"the {p} ranks, but embedding dims {bad} are not divisible by "
                             f"{p}; use a rank count that divides them, or table_wise / "
                             "row_wise sharding")
