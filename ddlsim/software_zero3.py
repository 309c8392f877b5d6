"""The software stack's ZeRO-3 fields, checked: options that the chosen ``zero3_gather`` ignores,
a ``zero3_implementation`` the stack does not run, and ``zero3_*`` fields a config sets on a plan
without ZeRO-3 (:mod:`ddlsim.software` resolves the stack and calls these).
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .software_fields import OverlapSpec

__all__ = ["ALTERNATIVE_ZERO3", "ZERO3_FIELDS", "check_gather_options", "check_implementation",
           "check_zero3_fields"]

#: the one ZeRO-3 implementation a stack may run instead of its own (its rules say where)
ALTERNATIVE_ZERO3 = "megatron_fsdp"

#: host costs of the list-form collectives, modelled under ``zero3_gather: per_tensor`` only
HOST_FIELDS = ("zero3_host_python_op", "zero3_host_copy", "zero3_host_gather_call")


def _where(sources: dict[str, str], stack: str) -> str:
    """Where ``zero3_gather``'s value came from: a config location, or the stack."""
    src = sources["zero3_gather"]
    return src if src.startswith(("system.", "parallel.")) else f"stack {stack!r}"


def check_gather_options(overlap: dict, sources: dict, stack: str) -> None:
    """Refuse a ZeRO-3 option set away from its default that ``zero3_gather`` ignores:
    module-hook options under ``per_layer``, host loops off ``per_tensor``, per-layer unit
    options and layer prefetch off ``per_layer``."""
    gather = overlap["zero3_gather"]
    if gather == "per_layer":
        for field in ("zero3_persistence_threshold", "zero3_max_reuse_distance",
                      "zero3_prefetch_modules", "zero3_max_live_parameters"):
            if overlap[field]:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]} applies to ZeRO-3 "
                    f"gathers from module hooks only, and zero3_gather is 'per_layer' "
                    f"({_where(sources, stack)}); set zero3_gather: per_module or per_tensor, "
                    f"or {field}: 0")
    if gather != "per_tensor":
        for field in HOST_FIELDS:
            if overlap[field]:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]:g} s applies to per-tensor "
                    f"ZeRO-3 gathers only (the list-form collectives' per-rank host loops), "
                    f"and zero3_gather is {gather!r} ({_where(sources, stack)}); "
                    f"set zero3_gather: per_tensor, or {field}: 0")
        if overlap["zero3_reduce_bucket_size"]:
            raise ConfigError(
                f"{sources['zero3_reduce_bucket_size']}: zero3_reduce_bucket_size = "
                f"{overlap['zero3_reduce_bucket_size']:g} applies to per-tensor ZeRO-3 only "
                f"(DeepSpeed 2021's gradient hooks), and zero3_gather is {gather!r} "
                f"({_where(sources, stack)}); set zero3_gather: per_tensor, or "
                "zero3_reduce_bucket_size: 0")
    if gather != "per_layer":
        for field, plain in (("zero3_reshard_after_forward", "always"), ("zero3_copy_out", False)):
            if overlap[field] != plain:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]!r} applies to per-layer "
                    f"ZeRO-3/FSDP units only, and zero3_gather is {gather!r} "
                    f"({_where(sources, stack)}); set zero3_gather: per_layer, or "
                    f"{field}: {plain!r}")
        if overlap["zero3_prefetch_layers"]:
            raise ConfigError(
                f"{sources['zero3_prefetch_layers']}: zero3_prefetch_layers = "
                f"{overlap['zero3_prefetch_layers']} applies to per-layer ZeRO-3 gathers, and "
                f"zero3_gather is {gather!r} ({_where(sources, stack)}); gathers "
                f"from module hooks prefetch by module: set zero3_prefetch_modules instead")


#: the stack's fields that only a ZeRO-3 plan (``parallel.zero_stage: 3``) reads: how its
#: parameters are gathered, prefetched, kept and reduce-scattered (their descriptions in
#: :mod:`ddlsim.software_fields` each say "ZeRO-3")
ZERO3_FIELDS = tuple(f for f in OverlapSpec.model_fields if f.startswith("zero3_"))


def check_zero3_fields(sw: Any, zero_stage: int) -> None:
    """Refuse the ``zero3_*`` fields a config sets itself (``system.software.overlap``) on a
    plan without ZeRO-3, which never reads them; a stack's own values never count.

    For one plan (:func:`ddlsim.load_config`, ``ddlsim predict``). A search or a sweep
    over ``parallel.zero_stage`` does not call it: its plans below stage 3 leave the fields
    unread, as the stack's defaults are.

    Parameters
    ----------
    sw : the resolved stack (:func:`resolve_software`), whose ``sources`` say who set a field
    zero_stage : the plan's ``parallel.zero_stage`` (0 to 3)

    Raises
    ------
    ConfigError
        naming each such field, its value, the plan's stage, and the two ways out.
    """
    if zero_stage == 3:
        return
    given = [f for f in ZERO3_FIELDS if sw.sources[f].startswith("system.software")]
    if not given:
        return
    each = [f"{sw.sources[f]}.{f} = {_shown(f, sw.overlap[f])}" for f in given]
    listed = each[0] if len(each) == 1 else ", ".join(each[:-1]) + " and " + each[-1]
    verb, it = ("applies", "it") if len(each) == 1 else ("apply", "them")
    raise ConfigError(
        f"{listed} {verb} to ZeRO-3 only, and parallel.zero_stage is {zero_stage}: a plan "
        f"without ZeRO-3 never reads {it}; remove {it} from system.software.overlap, or set "
        "parallel.zero_stage: 3")


def _shown(field: str, value: Any) -> str:
    """A field's value as a message quotes it: numbers as ``%g`` (seconds with `` s``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return f"{value:g}" + (" s" if field in HOST_FIELDS else "")


def check_implementation(stack: str, own: str, overlap: dict, sources: dict) -> None:
    """Refuse a ``zero3_implementation`` that is neither the stack's own (``own``) nor
    :data:`ALTERNATIVE_ZERO3` (whether the stack has that one is its rule
    ``no_megatron_fsdp``): another framework's ZeRO-3 is another stack."""
    value = overlap["zero3_implementation"]
    if value not in (own, ALTERNATIVE_ZERO3):
        raise ConfigError(
            f"{sources['zero3_implementation']}: zero3_implementation = {value!r} is not run "
            f"by the stack {stack!r}, whose ZeRO-3 is {own!r}; allowed: {own!r} or "
            f"{ALTERNATIVE_ZERO3!r} (where the stack has it). For another framework's "
            "ZeRO-3 pick its stack (system.software)")
