"""The model fields of today's Megatron-Core MoE runs (DeepSeek-V2/V3, Kimi-K2 in
Megatron-MoE-ModelZoo's configs): Multi-head Latent Attention, the pattern of MoE and dense
layers, and the shared experts, from the flags :mod:`.megatron` sets aside.

Megatron-LM d98e8a64 (2026):

* ``--multi-latent-attention`` (``TransformerConfig.multi_latent_attention``) and the MLA group
  of ``megatron/training/arguments.py`` lines 3546-3562: ``--q-lora-rank`` (default None: a
  direct query projection), ``--kv-lora-rank`` (default 32), ``--qk-head-dim`` (128, the part
  of a query/key head without positions), ``--qk-pos-emb-head-dim`` (64, the rotary part),
  ``--v-head-dim`` (128); read only with ``--multi-latent-attention``. With MLA,
  ``--qk-layernorm`` puts the norms of the query and key/value latents into the up
  projections (``gpt_layer_specs.py`` lines 104-115), which ddlsim's MLA always has
  (:meth:`~ddlsim.workloads.models.mla.MLA.params`); without it Megatron-Core runs none.
  ``--kv-channels`` sets no MLA head size (``multi_latent_attention.py``: the query head is
  ``qk_head_dim + qk_pos_emb_head_dim``);
* ``--moe-layer-freq`` (lines 327-350, ``moe_freq_type``): an integer ``N`` makes layer ``i``
  an MoE layer when ``i % N == 0`` (``gpt_layer_specs.py`` lines 647-650), or a Python list
  expression of 0/1 per layer (``_eval_pattern``: only ``,``, digits, brackets, ``+`` and
  ``*``);
* ``--moe-shared-expert-intermediate-size`` (``transformer_config.py`` line 701): the shared
  experts' total FFN size, run as one MLP of that size (``SharedExpertMLP``).
"""

from __future__ import annotations

import ast
import re

from .common import Draft

__all__ = ["MOE_MODEL_FLAGS", "moe_model_fields", "layer_pattern"]

#: Megatron-LM's MLA flags and their defaults (None: none)
MLA_FLAGS = {"q-lora-rank": ("model.q_lora_rank", None),
             "kv-lora-rank": ("model.kv_lora_rank", 32),
             "qk-head-dim": ("model.qk_nope_head_dim", 128),
             "qk-pos-emb-head-dim": ("model.qk_rope_head_dim", 64),
             "v-head-dim": ("model.v_head_dim", 128)}
#: a character Megatron's ``_eval_pattern`` does not allow in a layer pattern (d98e8a64
#: arguments.py lines 245-253: commas, digits, brackets, parentheses, ``+`` and ``*`` only)
_NOT_PATTERN = re.compile(r"[^,\d\[\]()+*]")
#: the flags :func:`moe_model_fields` reads
MOE_MODEL_FLAGS = ("multi-latent-attention", *MLA_FLAGS, "moe-layer-freq",
                   "moe-shared-expert-intermediate-size")


def moe_model_fields(draft: Draft, model: dict) -> None:
    """Set ``draft``'s MLA, MoE-layer and shared-expert fields from the flags in ``model``."""
    _mla(draft, model)
    _layer_freq(draft, model)
    shared = model.get("moe-shared-expert-intermediate-size")
    if shared is not None:
        arg = f"--moe-shared-expert-intermediate-size {' '.join(shared)}"
        if len(shared) != 1 or not shared[0].isdigit() or int(shared[0]) == 0:
            draft.refuse(arg, "expects one positive whole number")
        else:
            draft.set("model.n_shared_experts", 1, arg + " (one SharedExpertMLP)")
            draft.set("model.shared_expert_intermediate_size", int(shared[0]), arg)


def _mla(draft: Draft, model: dict) -> None:
    f = draft.fields
    given = [flag for flag in MLA_FLAGS if flag in model]
    if "multi-latent-attention" not in model:
        for flag in given:
            draft.note(f"--{flag} {' '.join(model[flag])}",
                       "no effect: Megatron reads it only with --multi-latent-attention")
        return
    if model["multi-latent-attention"]:
        draft.refuse("--multi-latent-attention", "takes no value")
        return
    draft.note("--multi-latent-attention", "Multi-head Latent Attention (the MLA fields below)")
    for flag, (path, default) in MLA_FLAGS.items():
        values = model.get(flag)
        if values is None:
            if default is not None:
                draft.set(path, default, f"no --{flag} (Megatron's default {default})")
            continue
        arg = f"--{flag} {' '.join(values)}"
        if len(values) != 1 or not values[0].isdigit() or int(values[0]) == 0:
            draft.refuse(arg, "expects one positive whole number")
        else:
            draft.set(path, int(values[0]), arg)
    if f.pop("model.qk_norm", False):
        draft.notes = [n for n in draft.notes if n[0] != "--qk-layernorm"]
        draft.note("--qk-layernorm", "with MLA: the norms of the query and key/value latents, "
                                     "which ddlsim's MLA has (not a norm per head)")
    else:
        draft.refuse("--multi-latent-attention", "without --qk-layernorm Megatron-Core's MLA "
                                                 "runs no latent norms, which ddlsim's MLA "
                                                 "always has (not modelled)")
    if f.pop("model.head_dim", None) is not None:
        draft.notes = [n for n in draft.notes if not n[0].startswith("--kv-channels")]
        draft.note("--kv-channels", "no effect with MLA (its heads are --qk-head-dim + "
                                    "--qk-pos-emb-head-dim and --v-head-dim wide)")


def layer_pattern(text: str, layers: int) -> list[int] | None:
    """Megatron's ``--moe-layer-freq`` as a 0/1 list of ``layers`` (1: an MoE layer), or None
    when ``text`` is neither a whole number nor a list expression of 0/1 with ``+`` and ``*``
    (``moe_freq_type``); a shell's quotes around it are dropped."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if text.isdigit():
        n = int(text)
        return [int(i % n == 0) for i in range(layers)] if n else None
    if _NOT_PATTERN.search(text):   # what Megatron's _eval_pattern refuses (spaces included)
        return None
    try:
        value = _evaluate(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        return None
    return value


def _evaluate(node: ast.AST) -> int | list:
    """A list expression of whole numbers, lists, ``+`` and ``*`` (nothing else)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
            if max(left if type(left) is int else right, 0) > 1 << 20:
                raise ValueError("too long")
            return left * right
    raise ValueError("not a list expression")


def _layer_freq(draft: Draft, model: dict) -> None:
    """``--moe-layer-freq`` as ddlsim's first dense layers and MoE step, where the pattern
    is one: layers ``i ≥ k`` with ``(i + 1) % f == 0`` (:meth:`~ddlsim.workloads.models.
    decoder.DecoderShape.is_moe_layer`)."""
    values = model.get("moe-layer-freq")
    if values is None:
        return
    arg = f"--moe-layer-freq {' '.join(values)}"
    layers = draft.fields.get("model.num_hidden_layers")
    pattern = layer_pattern(" ".join(values), layers or 0) if layers else None
    if pattern is None or len(pattern) != layers:
        draft.refuse(arg, "expects a whole number or a list expression of one 0/1 per layer "
                          f"(--num-layers {layers}), as Megatron's moe_freq_type reads it")
        return
    ones = [i for i, v in enumerate(pattern) if v]
    # the first MoE layer is past the dense ones, and consecutive MoE layers are a step apart
    steps = {1, ones[0] + 1, *([ones[1] - ones[0]] if len(ones) > 1 else [])} if ones else ()
    for k in sorted({0, ones[0]}) if ones else ():
        for step in sorted(steps):
            if pattern == [int(i >= k and (i + 1) % step == 0) for i in range(layers)]:
                if k:
                    draft.set("model.first_k_dense_replace", k, arg + " (dense first)")
                if step > 1:
                    draft.set("model.decoder_sparse_step", step, arg + " (every n-th)")
                if not k and step == 1:
                    draft.note(arg, "every layer an MoE layer")
                return
    draft.refuse(arg, "a pattern ddlsim does not express: it models the first k layers dense, "
                      "then every f-th layer an MoE layer (an integer N > 1 makes layer 0 "
                      "an MoE layer in Megatron)")
