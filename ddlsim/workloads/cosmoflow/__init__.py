"""CosmoFlow, the MLPerf HPC 3-D CNN, with spatial decomposition: the ``cosmoflow`` family.

Model section: :mod:`.schema`; layers, parameters and FLOPs: :mod:`.shapes`; the grid's
groups, rank classes and halo messages: :mod:`.grid`; the trace and memory: :mod:`.build`.
Presets: ``ddlsim/data/cosmoflow.yaml``. How the seed's proxy (``proxies/cosmoflow.cpp`` of
spcl/DNN-cpp-proxies) is reproduced: docs/workloads/cosmoflow.md.
"""

from __future__ import annotations

import math
from typing import Any

from ..registry import BASE_PLAN_FIELDS, WorkloadFamily, batch_phrase, register_workload
from .schema import CosmoFlowModel
from .shapes import conv_layers, dense_layers, halo_widths, parameter_count

__all__ = ["CosmoFlowFamily", "CosmoFlowModel"]


@register_workload("cosmoflow")
class CosmoFlowFamily(WorkloadFamily):
    """CosmoFlow: conv layers split over a spatial grid, dense layers split over its ranks."""

    schema = CosmoFlowModel
    #: the plan fields its rules and trace read (any other is refused when set)
    #: a sample is one volume: train.seq_length is 1 where the config leaves it out
    sample_length = 1
    plan_fields = (*BASE_PLAN_FIELDS, "parallel.collective_buffers")
    presets_file = "cosmoflow.yaml"

    def plan_from_model(self, model: Any) -> dict[str, Any]:
        """The spatial group is the mesh's tensor-parallel axis: its size is the grid's."""
        return {"tensor_model_parallel_size": math.prod(model.spatial_grid)}

    def check(self, cfg: Any) -> None:
        """The plan must be spatial × data parallel, the grid must hold the tensor-parallel
        ranks and split every conv layer's volume into whole, poolable sub-volumes."""
        m, p = cfg.model, cfg.parallel
        if cfg.train.seq_length != 1:
            raise ValueError(f"train.seq_length = {cfg.train.seq_length}: a cosmoflow sample is "
                             "one volume (its size is model.input_shape); set seq_length: 1")
        grid = list(m.spatial_grid)
        S = math.prod(grid)
        if p.pp > 1 or p.ep > 1 or p.zero_stage or p.dp_strategy != "ddp":
            raise ValueError(f"the cosmoflow family is spatial × data parallel with plain "
                             f"all-reduced gradients: pipeline_model_parallel_size = {p.pp}, "
                             f"expert_model_parallel_size = {p.ep}, zero_stage = "
                             f"{p.zero_stage} and dp_strategy = {p.dp_strategy!r} must be 1, "
                             "1, 0 and 'ddp'")
        if S != p.tp:
            raise ValueError(f"model.spatial_grid = {grid} splits each sample over "
                             f"{'·'.join(map(str, grid))} = {S} ranks, but "
                             f"parallel.tensor_model_parallel_size = {p.tp}: the spatial group "
                             f"is the mesh's tensor-parallel axis, so the two must be equal "
                             f"(set tensor_model_parallel_size: {S} or leave it out, or a grid "
                             f"of {p.tp} ranks)")
        _check_volumes(m)
        if S > 1:
            bad = [d for d in dense_layers(m) if d.n_out % S]
            if bad:
                raise ValueError(f"dense layer {bad[0].name} has {bad[0].n_out} outputs, not "
                                 f"divisible by the spatial group's {S} ranks "
                                 f"(model.spatial_grid = {grid}): each rank computes n_out/S "
                                 "outputs; choose a grid whose size divides fc_sizes and "
                                 "target_size")

    def build(self, cfg: Any):
        from .build import build_cosmoflow
        return build_cosmoflow(cfg)

    def memory(self, cfg: Any) -> list:
        from .build import cosmoflow_memory
        return cosmoflow_memory(cfg)

    def summary(self, model: Any) -> str:
        convs = conv_layers(model)
        side = "×".join(map(str, model.input_shape[:3]))
        fc = "-".join(str(d.n_out) for d in dense_layers(model))
        grid = "×".join(map(str, model.spatial_grid))
        return (f"{model.name}: {side}×{model.input_shape[3]} input, {len(convs)} conv "
                f"{model.kernel_size}³ ({convs[0].c_out}…{convs[-1].c_out} filters), dense "
                f"{fc}, {parameter_count(model) / 1e6:.3g} M params, spatial grid {grid}")

    def plan_summary(self, cfg: Any) -> str:
        """``spatial grid 2×2×1 × DP4 = 16 ranks``, the halo options when the grid splits
        the volume, where conv gradients are all-reduced, the batch and the dtype."""
        m, t = cfg.model, cfg.train
        grid = "×".join(map(str, m.spatial_grid))
        parts = [f"spatial grid {grid} × DP{cfg.dp} = {cfg.world_size} ranks"]
        if cfg.parallel.tp > 1:
            parts.append(f"halos (forward {m.forward_halo}, input {m.input_halo}, backward "
                         f"{m.backward_halo}, {'overlapped' if m.halo_overlap else 'no overlap'})")
        parts.append("conv gradients all-reduced "
                     + ("over all ranks" if m.conv_grad_allreduce == "world"
                        else "over the spatial group, then over DP"))
        parts += [batch_phrase(cfg), t.dtype]
        return ", ".join(parts)

    def group_labels(self, cfg: Any) -> dict[str, str]:
        """``tp`` is the spatial group (halos and dense-layer exchanges); ``dp`` the
        gradient all-reduces, over every rank for the convs by default."""
        where = "conv ones over all ranks" if cfg.model.conv_grad_allreduce == "world" \
            else "conv ones over the spatial group, then DP"
        return {"tp": "tp (spatial group)", "dp": f"dp (gradients; {where})"}


def _check_volumes(m) -> None:
    """Every conv layer's volume splits evenly over the grid, each sub-volume is at least a
    halo deep and pools locally (its sides divisible by the pool size)."""
    grid = m.spatial_grid
    deep = max(halo_widths(m.kernel_size))
    for c in conv_layers(m):
        for axis, (n, p) in enumerate(zip(c.side, grid)):
            if p == 1:
                continue
            name = "xyz"[axis]
            if n % p or (n // p) % m.pool_size or n // p < deep:
                raise ValueError(
                    f"model.spatial_grid = {list(grid)} cannot split {c.name}'s volume "
                    f"{'×'.join(map(str, c.side))} along {name}: {n} / {p} must be a whole "
                    f"number of voxels, divisible by pool_size = {m.pool_size} (so that "
                    f"pooling stays on the rank) and at least the halo depth {deep}; use a "
                    f"smaller {name} split (at most {c.side[axis] // m.pool_size} for this "
                    f"layer, a divisor of it)")
