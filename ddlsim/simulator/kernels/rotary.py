"""The rotary embedding's kernels as memory passes (:mod:`.elementwise`'s table, its RoPE row):
bytes per element of q (or k) of each kernel of a fused or unfused rotary embedding
(:func:`rope_passes`, per ``software.rope_form``), the widths it rotates (:func:`rope_widths`;
MLA's decoupled parts), a layer's bytes (:func:`rope_bytes`) and the kernels' classes
(:func:`rope_classes`, :data:`.elementwise.ELEMENTWISE_CLASSES`). The layer's element-wise
kernels (:func:`.elementwise.layer_elementwise_parts`), their backward
(:mod:`.elementwise_backward`) and MLA's recomputed RoPE
(:mod:`~ddlsim.workloads.decoder.recompute_modules`) take these functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rope_bytes", "rope_widths", "rope_passes", "rope_classes"]


def rope_bytes(shape: Any, b: float, s: float, t: int, dtype_bytes: float,
               sw: Any) -> list[float]:
    """Bytes of each kernel of the rotary embedding of one layer's q and k on one of ``t``
    ranks, in launch order: :func:`rope_passes` over q, then over k (every stack rotates the
    two tensors by separate calls); none without rotary positions. Its backward moves the
    same bytes (:func:`.elementwise_backward.layer_elementwise_backward_kernels`).

    With partial rotary embeddings (``shape.rotary_share`` below 1: Nemotron-4 rotates half of
    each head) an unfused form's kernels run on the rotated slice only (Megatron-Core's
    ``_apply_rotary_pos_emb_bshd`` splits ``t[..., :rot_dim]`` from ``t[..., rot_dim:]``;
    the ``torch.cat`` of the two after it, which that function also runs at a share of 1, is
    not counted), while a fused kernel still reads and writes whole heads
    (TransformerEngine's ``fused_rope.cu`` copies the dimensions it does not rotate)."""
    if shape.positions != "rotary":
        return []
    fused = bool(sw.fused_rope)
    per = rope_passes(fused, sw.rope_form, dtype_bytes)
    share = 1.0 if fused else shape.rotary_share
    return [p * b * s * width * share for width in rope_widths(shape, t) for p in per]


def rope_widths(shape: Any, t: int) -> tuple[float, float]:
    """Elements per token the rotary embedding rotates on one of ``t`` ranks, (query, key):
    ``q_width/t`` and ``kv_width/t``; MLA rotates only the decoupled parts, ``a·d_r/t`` of
    the queries and the one shared ``d_r`` key, which every rank holds whole (NVIDIA/Megatron-LM
    d7288711 ``multi_latent_attention.py`` ``qkv_up_proj_and_rope_apply``: ``q_pos_emb``,
    ``k_pos_emb`` of ``qk_pos_emb_head_dim``)."""
    if shape.mla is not None:
        d_r = shape.mla.qk_rope_head_dim
        return shape.heads * d_r / t, float(d_r)
    return shape.q_width / t, shape.kv_width / t


def rope_passes(fused: bool, form: str, dtype_bytes: float) -> list[float]:
    """Bytes per element of q (or k) moved by each kernel of its rotary embedding (the module
    docstring's table): one fused kernel (read, write), or the stack's unfused ``form``
    (``software.rope_form``):

    * ``rotate_half`` (Megatron's ``apply_rotary_pos_emb``: ``t * cos + _rotate_half(t) *
      sin``): ``·cos`` 2, negate 1 (``-x2``, the second half only: ``_rotate_half`` chunks
      ``t`` and returns ``cat((-x2, x1))``), concatenate 2, ``·sin`` 2, add 3, in units of ``d``;
    * ``complex`` (torchtitan's ``apply_rotary_emb``: ``view_as_complex(xq.float())`` times
      ``freqs_cis``, ``view_as_real``, ``type_as(xq)``): the upcast (read ``d``, write 4), the
      complex multiply in fp32 (read 4, write 4; ``freqs_cis``, ``s × d/2`` broadcast over the
      batch and heads, not counted), the cast back (read 4, write ``d``): ``2d + 16``, 20 B
      in bf16, where fp32 training (``d`` = 4) has no casts;
    * ``real_matrix`` (IBM fms's ``RotaryEmbedding.adjusted_qk``, "avoids complex numbers,
      and so can be used with torch.compile"): ``q.float().view(..., d/2, 2)``, then
      ``freqs[..., None, :, :, :].mul(q_.unsqueeze(-2))``, each pair times its position's
      2 × 2 rotation (the fp32 ``[b, s, 1, d/2, 2, 2]`` table, broadcast over the heads, not
      counted): read 4, write two fp32 products per element, 8; ``.sum(5)`` over the pair:
      read 8, write 4; ``.flatten(3).type_as(q)``: read 4, write ``d``. With the upcast,
      ``2d + 32``, 36 B in bf16; in fp32 ``.float()`` and ``type_as`` return their input (no
      kernel). Not counted: the five tiny kernels each call runs once for q and k together
      (``arange(s).repeat(b, 1)`` for the positions, ``max`` of their first column and its
      ``+ s``, the table's gather ``cached_freqs[position_ids]``, ``b·s·d·8`` B each way: under
      2 % of the form's bytes at 32 heads).

    Parameters
    ----------
    fused : bool
        the stack's ``fused_rope``.
    form : {"rotate_half", "complex", "real_matrix"}
        the stack's ``rope_form``.
    dtype_bytes : float
        bytes per element (B).

    Returns
    -------
    list of float
        bytes per element, one entry per kernel.

    References
    ----------
    microsoft/Megatron-DeepSpeed 1bcd14d ``megatron/model/rotary_pos_embedding.py``
    ``apply_rotary_pos_emb``; pytorch/torchtitan 9dec370 ``torchtitan/models/llama/model.py``
    ``apply_rotary_emb`` (lines 108-113); foundation-model-stack/foundation-model-stack
    953ef99b ``fms/modules/positions.py`` ``RotaryEmbedding.adjusted_qk`` (lines 213-268).
    """
    d = dtype_bytes
    casts = d < 4
    if fused:
        return [2 * d]
    if form in _ROPE_PRODUCTS:
        return ([d + 4] if casts else []) + _ROPE_PRODUCTS[form] + ([4 + d] if casts else [])
    return [p * d for p in (2, 1, 2, 2, 3)]


#: the fp32 kernels between the upcast and the cast back of an unfused rotary embedding's
#: form (:func:`rope_passes`), bytes per element of q (or k): torchtitan's complex multiply;
#: fms's broadcast multiply (two fp32 products an element) and its sum over the pair
_ROPE_PRODUCTS = {"complex": [8.0], "real_matrix": [12.0, 12.0]}


def rope_classes(fused: bool, form: str, dtype_bytes: float) -> list[str]:
    """The class of each kernel :func:`rope_passes` gives (same arguments;
    :data:`ELEMENTWISE_CLASSES`): the upcast of the complex and real-matrix forms
    ``rope_upcast`` (the same ``.float()`` copy of a contiguous bf16 tensor), torchtitan's
    complex multiply ``rope_complex_mul`` (the cast back, a vectorised copy, none); fms's
    broadcast multiply and pair sum none (no device has measured them), nor a fused kernel
    or the rotate-half form's kernels."""
    n = len(rope_passes(fused, form, dtype_bytes))
    if fused or form not in _ROPE_PRODUCTS:
        return [""] * n
    casts = dtype_bytes < 4
    products = ["rope_complex_mul"] if form == "complex" else [""] * len(_ROPE_PRODUCTS[form])
    return (["rope_upcast"] if casts else []) + products + ([""] if casts else [])
