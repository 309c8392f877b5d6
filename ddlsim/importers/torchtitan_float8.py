"""torchtitan's ``[float8]`` keys for FSDP (``enable_fsdp_float8_all_gather``,
``precompute_float8_dynamic_scale_for_fsdp``) as the stack's fields of the same names
(:mod:`ddlsim.workloads.decoder.fsdp_float8`), where torchtitan hands them to torchao."""

from __future__ import annotations

from typing import Any

from .common import Draft

__all__ = ["fsdp_float8"]


def fsdp_float8(draft: Draft, s: dict, doc: dict, recipe: Any) -> None:
    """Read the FSDP keys of ``[float8]`` into ``draft``.

    The float8 all-gather is set where torchtitan turns it on: float8 among the converters,
    no ``recipe_name`` (07c00d9 float8.py lines 78-82 assert against one), a shard degree
    other than 1 (9dec370 float8.py lines 51-54, 07c00d9 lines 97-101: ``dp_shard_enabled``);
    the precompute only with the all-gather (lines 68-71, 107-110). Otherwise each key set
    is noted as without effect, or refused with torchtitan's reason.

    Parameters
    ----------
    draft : Draft
        The fields being read; the keys are set, noted or refused on it.
    s : dict
        The ``[float8]`` section.
    doc : dict
        The whole config (2025 format), for ``[model] converters`` and the shard degree.
    recipe : str or None
        ``[float8] recipe_name``.
    """
    on, pre = s.get("enable_fsdp_float8_all_gather"), s.get(
        "precompute_float8_dynamic_scale_for_fsdp")
    key, pre_key = ("[float8] enable_fsdp_float8_all_gather = true",
                    "[float8] precompute_float8_dynamic_scale_for_fsdp = true")
    model, par = (doc.get(k) if isinstance(doc.get(k), dict) else {}
                  for k in ("model", "parallelism"))
    converters = model.get("converters", [])
    converters = [converters] if isinstance(converters, str) else converters
    if not isinstance(converters, list):     # [model] refuses it by name
        converters = []
    shard = par.get("data_parallel_shard_degree", -1)
    if on and "float8" not in converters:
        draft.note(key, "no effect: [model] converters does not convert to float8")
    elif on and recipe is not None:
        draft.refuse(key, f"torchtitan refuses it with [float8] recipe_name = {recipe!r} "
                     "(07c00d9 components/quantization/float8.py lines 78-82)")
    elif on and shard == 1:
        draft.note(key, "no effect: torchtitan turns it on only with "
                   "data_parallel_shard_degree > 1 (float8.py: dp_shard_enabled)")
    elif on:
        draft.set("system.software.kernels.enable_fsdp_float8_all_gather", True, key)
        if pre:
            draft.set("system.software.kernels.precompute_float8_dynamic_scale_for_fsdp",
                      True, pre_key)
        return
    if pre:
        draft.note(pre_key, "no effect without the float8 all-gather (torchtitan float8.py: "
                   "precompute_scale needs it)")
