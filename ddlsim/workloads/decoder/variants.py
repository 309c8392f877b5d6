"""The attention variants of a ``llama`` model section (MLA, query/key norms, sinks, sliding
window) between the section's HuggingFace-named fields and :class:`DecoderShape`'s.

``kv_lora_rank`` switches on Multi-head Latent Attention and then needs ``qk_nope_head_dim``,
``qk_rope_head_dim`` and ``v_head_dim`` (``q_lora_rank`` may stay null); ``window_layers``
needs ``sliding_window``. Each rule's error names the field, its value and what is allowed.
"""

from __future__ import annotations

from typing import Any

from ..models.mla import MLA

__all__ = ["check_variants", "variant_shape_fields", "variant_section", "mla_linear_gemms",
           "MLA_FIELDS"]

#: The section fields of Multi-head Latent Attention (HuggingFace ``deepseek_v3`` names)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")


def check_variants(m: Any) -> None:
    """Cross-field rules of the variants; raises ValueError (the section validator's)."""
    given = {n: getattr(m, n) for n in MLA_FIELDS if getattr(m, n) is not None}
    if given and m.kv_lora_rank is None:
        raise ValueError(f"model fields {given} describe Multi-head Latent Attention but "
                         "kv_lora_rank is not given; set it, or remove them")
    if m.kv_lora_rank is not None:
        missing = [n for n in MLA_FIELDS[2:] if getattr(m, n) is None]
        if missing:
            raise ValueError(f"model.kv_lora_rank = {m.kv_lora_rank} (Multi-head Latent "
                             f"Attention) needs {', '.join(missing)}")
        g = m.num_key_value_heads
        if (g is not None and g != m.num_attention_heads) or m.qk_norm:
            raise ValueError(f"Multi-head Latent Attention has a key and value per query head: "
                             f"num_key_value_heads = {g} (allowed: null or "
                             f"{m.num_attention_heads}) and qk_norm = {m.qk_norm} (allowed: "
                             "false)")
    if m.window_layers is not None:
        if m.sliding_window is None:
            raise ValueError(f"model.window_layers = {m.window_layers} needs sliding_window")
        if m.window_layers > m.num_hidden_layers:
            raise ValueError(f"model.window_layers = {m.window_layers} exceeds "
                             f"num_hidden_layers = {m.num_hidden_layers}")


def variant_shape_fields(m: Any) -> dict:
    """The :class:`DecoderShape` keyword arguments of a checked section's variants."""
    out: dict = {"qk_norm": m.qk_norm, "attention_sinks": m.attention_sinks,
                 "glu_clamp": m.swiglu_limit}
    if m.kv_lora_rank is not None:
        out["mla"] = MLA(kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                         qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
                         q_lora_rank=m.q_lora_rank, bias=m.attention_bias)
    if m.sliding_window is not None:
        out["sliding_window"] = m.sliding_window
        out["window_layers"] = (m.num_hidden_layers if m.window_layers is None
                                else m.window_layers)
    return out


def variant_section(f: dict) -> dict:
    """The section fields of :class:`DecoderShape` fields' variants (the inverse of
    :func:`variant_shape_fields`, for a HuggingFace ``config.json``); only those set."""
    out: dict = {}
    mla = f.get("mla")
    if mla is not None:
        out.update({n: getattr(mla, n) for n in MLA_FIELDS})
        out["attention_bias"] = mla.bias
    for key in ("qk_norm", "attention_sinks", "router_bias"):
        if f.get(key):
            out[key] = True
    if f.get("first_dense_layers"):
        out["first_k_dense_replace"] = f["first_dense_layers"]
    if f.get("glu_clamp") is not None:
        out["swiglu_limit"] = f["glu_clamp"]
    if f.get("sliding_window") is not None:
        out["sliding_window"] = f["sliding_window"]
        out["window_layers"] = f["window_layers"]
    return out


def mla_linear_gemms(shape: Any, M: float, t: int, sp: bool = False) -> dict:
    """:func:`.layerkernels.linear_gemms` of an MLA layer: ``qkv`` is the tuple of its four
    projections' ``(M, N, K)`` (:meth:`MLA.gemms`: down projections replicated, on the rank's
    ``M/t`` tokens under sequence parallelism ``sp``; up ones split by heads), ``proj`` the
    output projection, ``fc1``/``fc2`` the dense MLP's."""
    g = shape.mla.gemms(M, shape.hidden, shape.heads, t, sp)
    f = shape.ffn
    return {"qkv": tuple(v for k, v in g.items() if k != "proj"), "proj": g["proj"],
            "fc1": (M, (shape.mlp_matrices - 1) * f / t, shape.hidden),
            "fc2": (M, shape.hidden, f / t)}


def variant_phrases(shape: Any) -> tuple[str, str]:
    """What the one-line model summary adds for the variants: after the heads (MLA's ranks,
    query/key norms, sinks, the window and its layers) and after the MoE block (the dense
    first layers); empty strings for a model without them."""
    attn = []
    if shape.mla is not None:
        m = shape.mla
        attn.append(f"MLA (q {m.q_lora_rank or 'full'}, kv {m.kv_lora_rank}, "
                    f"qk {m.qk_nope_head_dim}+{m.qk_rope_head_dim}, v {m.v_head_dim})")
    if shape.qk_norm:
        attn.append("qk-norm")
    if shape.attention_sinks:
        attn.append("sinks")
    if shape.sliding_window is not None and shape.window_layers:
        where = "" if shape.window_layers == shape.layers else \
            f" on {shape.window_layers} layers"
        attn.append(f"window {shape.sliding_window}{where}")
    dense = f", first {shape.first_dense_layers} dense" if shape.first_dense_layers else ""
    return ("".join(f" {x}" if i == 0 and x.startswith("MLA") else f", {x}"
                    for i, x in enumerate(attn)), dense)
