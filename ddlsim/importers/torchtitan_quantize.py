"""torchtitan's ``[compile]`` section and its ``[quantize]`` sections of late 2025.

torchtitan 8a2686c (2025-09-30, "Refactor quantization API") moved ``[float8]`` to
``[quantize.linear.float8]`` and registered the converters by those names
(``torchtitan/components/quantization/float8.py`` lines 238-239, ``mx.py`` lines 171-172 at
238fa99, the last commit with TOML configs): ``quantize.linear.float8``,
``quantize.grouped_mm.float8``, ``quantize.linear.mx``, ``quantize.grouped_mm.mx``.
``[model] converters`` names which run (``protocols/model_converter.py`` lines 60-62 look
each name up in that registry; an unknown name is a ``KeyError``); a ``[quantize.*]`` section
whose converter is not named configures nothing. ``[compile] enable`` with ``"model"`` in
``components`` compiles each TransformerBlock (238fa99 ``models/llama3/infra/parallelize.py``
lines 107-123): the stack's ``compile``.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import Draft

__all__ = ["QUANTIZE_CONVERTERS", "read_quantize", "read_compile", "converter"]

#: converter name (238fa99) → its [quantize] section, or None where ddlsim does not model it
QUANTIZE_CONVERTERS = {"quantize.linear.float8": ("linear", "float8"),
                       "quantize.grouped_mm.float8": None,
                       "quantize.linear.mx": None, "quantize.grouped_mm.mx": None}


def converter(draft: Draft, name: str, doc: dict) -> None:
    """One name of ``[model] converters``: the float8 linears are ``train.dtype: fp8``."""
    arg = f"[model] converters = {name!r}"
    if name == "float8" and "quantize" in doc:
        draft.refuse(arg, "this config has torchtitan's [quantize] sections (8a2686c, "
                          "2025-09-30), which register the float8 linears as "
                          "'quantize.linear.float8'; torchtitan raises KeyError for "
                          "'float8' (protocols/model_converter.py lines 60-62): name "
                          "'quantize.linear.float8'")
    elif name == "quantize.linear.float8" and _tp(doc) > 1:
        draft.refuse(arg, "with tensor parallelism torchtitan 238fa99 looks for 'float8' in "
                          "the converters (models/llama3/infra/parallelize.py line 77), so "
                          "under this name its TP runs without float8's TP plan, which "
                          "ddlsim's fp8 with TP models: not modelled")
    elif name in ("float8", "quantize.linear.float8"):
        draft.set("train.dtype", "fp8", arg)
    elif name in QUANTIZE_CONVERTERS:
        draft.refuse(arg, "not modelled yet (ddlsim models the float8 linears: "
                          "'quantize.linear.float8', or 'float8' before 8a2686c)")
    else:
        draft.refuse(arg, f"not a converter ddlsim models; torchtitan's: "
                          f"{', '.join(QUANTIZE_CONVERTERS)}")


def _tp(doc: dict) -> int:
    par = doc.get("parallelism")
    tp = par.get("tensor_parallel_degree", 1) if isinstance(par, dict) else 1
    return tp if type(tp) is int else 1


def _named(doc: dict) -> list[str]:
    model = doc.get("model")
    names = model.get("converters", []) if isinstance(model, dict) else []
    return [names] if isinstance(names, str) else list(names) if isinstance(names, list) else []


def read_quantize(draft: Draft, s: dict, doc: dict,
                  float8: Callable[[Draft, dict, dict, str], None]) -> None:
    """``[quantize.linear.float8]`` read as ``[float8]`` is (by ``float8``) when its converter
    runs, noted as without effect when it does not; another sub-section refused when its
    converter runs."""
    named = _named(doc)
    for kind, formats in s.items():
        for fmt, keys in (formats.items() if isinstance(formats, dict) else [(None, formats)]):
            label = f"quantize.{kind}.{fmt}"
            if not isinstance(keys, dict) or label not in QUANTIZE_CONVERTERS:
                draft.refuse(f"[quantize.{kind}]", "torchtitan's [quantize] sections are "
                             + ", ".join(f"[{c}]" for c in QUANTIZE_CONVERTERS))
            elif label not in named:
                draft.note(f"[{label}]", f"no effect: '{label}' is not in [model] converters")
            elif QUANTIZE_CONVERTERS[label] is None:
                draft.refuse(f"[{label}]", "not modelled yet")
            else:
                float8(draft, keys, doc, label)


def read_compile(draft: Draft, s: dict, _doc: dict) -> None:
    """``[compile] enable`` with ``"model"`` in ``components`` (its default: ``["model",
    "loss"]``, job_config.py lines 721-726) is the stack's ``compile``; the loss compiled is
    not modelled (ddlsim runs the stack's eager cross-entropy)."""
    components = s.get("components", ["model", "loss"])
    arg = f"[compile] enable = true, components = {components!r}"
    if not s.get("enable"):
        draft.note("[compile] enable = false", "eager, as the stack's compile: false")
    elif not isinstance(components, list) or "model" not in components:
        draft.refuse(arg, "ddlsim models the compiled TransformerBlocks ('model' in "
                          "components); the loss compiled alone is not modelled")
    else:
        draft.set("system.software.compile", True, arg)
        if "loss" in components:
            draft.unmodelled_arg(f"{arg} (loss)", "the compiled loss's fusions; ddlsim "
                                 "times the stack's eager cross-entropy")
    for key, value in s.items():
        if key == "backend" and value != "inductor":
            draft.refuse(f"[compile] backend = {value!r}", "ddlsim's compile is inductor's")
        elif key not in ("enable", "components", "backend"):
            draft.refuse(f"[compile] {key} = {value!r}", "not a key ddlsim reads")
