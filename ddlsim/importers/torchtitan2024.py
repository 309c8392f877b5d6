"""torchtitan's config format of 2024 (``torchtitan/config_manager.py`` at 9dec370,
2024-12-26) rewritten in the 2025 one (``torchtitan/config/job_config.py``), which
:mod:`.torchtitan` reads; such a run gets the ``torchtitan-2024`` stack.

The 2024 format keeps the data-parallel and TP degrees, ``compile`` and the loss-parallel
switch under ``[training]``, pipelining, context parallelism and async TP under
``[experimental]``, float8 as ``[float8] enable_float8_linear`` (dynamic tensorwise scaling),
the norm under ``[model] norm_type`` and the fused optimizer as ``[optimizer] fused``.
"""

from __future__ import annotations

from typing import Any

from .common import Draft

__all__ = ["is_2024", "to_2025", "STACK_2024"]

STACK_2024 = "torchtitan-2024"

#: [training] keys of 2024 that moved to [parallelism]
_TRAINING_TO_PARALLELISM = ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                            "tensor_parallel_degree", "disable_loss_parallel")
#: [experimental] keys of 2024 that moved to [parallelism] under the same name
_EXPERIMENTAL_TO_PARALLELISM = ("pipeline_parallel_degree", "context_parallel_degree",
                                "pipeline_parallel_schedule", "context_parallel_rotate_method",
                                "enable_async_tensor_parallel", "pipeline_parallel_split_points")


def is_2024(doc: dict) -> bool:
    """Whether ``doc`` is in the 2024 format: an ``[experimental]`` section, parallel degrees
    under ``[training]``, ``[model] norm_type`` or ``[float8] enable_float8_linear``."""
    training, model, float8 = (doc.get(k) if isinstance(doc.get(k), dict) else {}
                               for k in ("training", "model", "float8"))
    return ("experimental" in doc or any(k in training for k in _TRAINING_TO_PARALLELISM)
            or "norm_type" in model or "enable_float8_linear" in float8)


def to_2025(doc: dict, draft: Draft) -> dict:
    """``doc`` (2024 format) in the 2025 format; the keys that set a stack field are set on
    ``draft`` here (norm kernel, fused optimizer); the rest is left to the 2025 reader."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    training = out.get("training", {})
    parallelism = out.setdefault("parallelism", {})
    if not (isinstance(training, dict) and isinstance(parallelism, dict)):
        return out          # the reader refuses a section that is not a table, by name
    for key in _TRAINING_TO_PARALLELISM:
        if key in training:
            parallelism[key] = training.pop(key)
    experimental = out.pop("experimental", {})
    if not isinstance(experimental, dict):
        draft.refuse("[experimental]", "expects a table")
        experimental = {}
    for key in _EXPERIMENTAL_TO_PARALLELISM:
        if key in experimental:
            parallelism[key] = experimental.pop(key)
    _microbatches(experimental, training, parallelism, draft)
    for key, value in experimental.items():
        draft.refuse(f"[experimental] {key} = {value!r}", "not a key ddlsim reads")
    _model(out.get("model", {}), draft)
    _optimizer(out.get("optimizer", {}), draft)
    _float8(out, draft)
    return out


def _microbatches(experimental: dict, training: dict, parallelism: dict,
                  draft: Draft) -> None:
    """``pipeline_parallel_microbatches`` (default: one per stage, 9dec370
    parallelisms/pipeline_llama.py) as the 2025 micro-batch size."""
    pp = parallelism.get("pipeline_parallel_degree", 1)
    n = experimental.pop("pipeline_parallel_microbatches", None)
    if not (isinstance(pp, int) and pp > 1):
        return
    n = pp if n is None else n
    local = training.get("batch_size", 8)
    if not (isinstance(n, int) and isinstance(local, int) and n > 0 and local % n == 0):
        draft.refuse(f"[experimental] pipeline_parallel_microbatches = {n!r}",
                     f"must divide [training] batch_size = {local!r}")
        return
    parallelism["pipeline_parallel_microbatch_size"] = local // n


def _model(model: Any, draft: Draft) -> None:
    norm = model.pop("norm_type", "rmsnorm") if isinstance(model, dict) else "rmsnorm"
    if norm == "fused_rmsnorm":
        draft.set("system.software.kernels.fused_layernorm", True,
                  "[model] norm_type = 'fused_rmsnorm' (torchtitan's Triton RMSNorm kernel)")
    elif norm != "rmsnorm":
        draft.refuse(f"[model] norm_type = {norm!r}", "ddlsim reads rmsnorm and fused_rmsnorm "
                     "for the llama3 flavors")


def _optimizer(optimizer: Any, draft: Draft) -> None:
    if isinstance(optimizer, dict) and optimizer.pop("fused", False):
        draft.set("system.software.kernels.fused_optimizer", True, "[optimizer] fused = true")


def _float8(doc: dict, draft: Draft) -> None:
    float8 = doc.get("float8")
    if not isinstance(float8, dict):
        return
    if float8.pop("enable_float8_linear", False):
        model = doc.setdefault("model", {})
        if isinstance(model, dict):        # else the reader refuses [model] by name
            model["converters"] = ["float8"]
    for key in ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output"):
        value = float8.pop(key, "dynamic")
        if value != "dynamic":
            draft.refuse(f"[float8] {key} = {value!r}", "ddlsim models dynamic scaling "
                         "(the tensorwise recipe)")
