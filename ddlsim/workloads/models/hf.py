"""HuggingFace ``config.json`` files, exactly as published, as :class:`DecoderShape` fields.

Covered styles (``model_type``): ``gpt2`` (``n_layer``, ``n_embd``, ``n_head``,
``n_positions``, ``n_inner``, ``activation_function``), ``llama``, ``mistral``, ``mixtral``
(``num_local_experts``, ``num_experts_per_tok``), ``qwen2`` (bias on q/k/v only),
``qwen2_moe`` (``num_experts``, ``moe_intermediate_size``, one gated shared expert), ``qwen3``
and ``qwen3_moe`` (query/key norms, explicit ``head_dim``), ``deepseek_v3`` (Multi-head Latent
Attention, ``n_routed_experts`` + ``n_shared_experts``, ``first_k_dense_replace`` dense layers),
``deepseek_v2`` (the same, with a router without V3's ``e_score_correction_bias``), ``phi3``
(fused ``qkv_proj`` and ``gate_up_proj``, the one QKV and one gated fc1 GEMM a Megatron layer
runs; a sliding window on every layer, as Mistral) and ``gpt_oss`` (biases everywhere,
attention sinks, sliding-window attention on the layers ``layer_types`` names) and
``nemotron`` (Nemotron-4: squared-ReLU MLP, LayerNorm1p, partial rotary embeddings). What each
architecture fixes in code rather than in its config (gated MLP, norm, positions, biases) is
taken from the HuggingFace ``modeling_<type>.py`` of that architecture (transformers 4.56).

Keys that change neither the time nor the memory of a training step (token ids, epsilons,
initialisation, RoPE base and scaling, dtype, versions, …) are declared with the reason in
:mod:`.hf_keys` and pass silently; keys whose value changes the step but is not modelled
(quantized weights, soft-capping, …) and keys ddlsim does not know are returned in a list, to
be reported once in a warning line, never as errors. Missing essential keys and wrong types
raise :class:`~ddlsim.errors.ConfigError` naming key, value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..registry import unmodelled_warning  # noqa: F401  (re-exported)
from .decoder import DecoderShape
from .mla import MLA

__all__ = ["from_hf_config", "read_hf_config", "unmodelled_warning", "MODEL_TYPES",
           "BALANCING_KEYS"]

#: model_type → (layers, hidden, heads, ffn, positions) key names, and fixed architecture facts
_GPT2_KEYS = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions")
_LLAMA_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
               "max_position_embeddings")
_ROTARY_GATED = dict(gated_mlp=True, norm="rmsnorm", positions="rotary", dropout=False,
                     qkv_bias=False, out_bias=False, mlp_bias=False)
MODEL_TYPES: dict[str, tuple[tuple[str, ...], dict]] = {
    "gpt2": (_GPT2_KEYS, dict(gated_mlp=False, norm="layernorm", positions="learned",
                              qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=True)),
    "llama": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    "mistral": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    "mixtral": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    "qwen2": (_LLAMA_KEYS, dict(_ROTARY_GATED, qkv_bias=True, tied_embeddings=False)),
    "qwen2_moe": (_LLAMA_KEYS, dict(_ROTARY_GATED, qkv_bias=True, tied_embeddings=False)),
    "qwen3": (_LLAMA_KEYS, dict(_ROTARY_GATED, qk_norm=True, tied_embeddings=False)),
    "qwen3_moe": (_LLAMA_KEYS, dict(_ROTARY_GATED, qk_norm=True, tied_embeddings=False)),
    "deepseek_v3": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    # modeling_deepseek_v2.py: V3's attention (DeepseekV2Attention: MLA, q_proj when
    # q_lora_rank is null) and MoE layers (n_shared_experts × moe_intermediate_size shared
    # MLP, the first first_k_dense_replace layers dense); its gate has no bias (V3: E)
    "deepseek_v2": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    # modeling_phi3.py: Phi3Attention.qkv_proj (hidden -> (a + 2g)·d, no bias), o_proj (no
    # bias), Phi3MLP.gate_up_proj (hidden -> 2f, no bias), down_proj; RMSNorm before attention
    # and MLP; the config's attention_bias and mlp_bias are not read by the model
    "phi3": (_LLAMA_KEYS, dict(_ROTARY_GATED, tied_embeddings=False)),
    # modeling_nemotron.py: NemotronLayerNorm1P (a LayerNorm with weight + 1 and a bias),
    # NemotronMLP down_proj(act_fn(up_proj(x))) with ACT2FN[hidden_act] (relu2), q/k/v/o and
    # MLP biases per attention_bias and mlp_bias, rotary embeddings on partial_rotary_factor
    # of each head (NemotronConfig default 0.5), no dropout in training besides
    # attention_dropout
    "nemotron": (_LLAMA_KEYS, dict(gated_mlp=False, norm="layernorm", positions="rotary",
                                   dropout=False, qkv_bias=False, out_bias=False,
                                   mlp_bias=False, tied_embeddings=False)),
    # modeling_gpt_oss.py: q/k/v/o biases (the config class sets attention_bias = True), expert
    # biases (gate_up_proj_bias, down_proj_bias), a router bias and one sink per head
    "gpt_oss": (_LLAMA_KEYS, dict(_ROTARY_GATED, qkv_bias=True, out_bias=True, mlp_bias=True,
                                  router_bias=True, attention_sinks=True, tied_embeddings=False)),
}

#: The model types of DeepSeek's Multi-head Latent Attention and DeepSeekMoE layers
_DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v2")

#: Activations HuggingFace's ACT2FN knows that these architectures use.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu",
               "silu", "swish", "relu2")

#: Keys read on purpose, besides the per-style size keys.
_READ = {"model_type", "vocab_size", "num_key_value_heads", "head_dim", "hidden_act",
         "activation_function", "tie_word_embeddings", "attention_bias", "mlp_bias",
         "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
         "shared_expert_intermediate_size", "decoder_sparse_step", "resid_pdrop",
         "embd_pdrop", "attn_pdrop", "sliding_window", "use_sliding_window", "max_window_layers",
         "layer_types", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
         "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
         "qk_rope_head_dim", "v_head_dim", "router_aux_loss_coef", "n_group", "topk_group",
         "swiglu_limit"}


def _err(source: str, key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{source}: {key} = {value!r} is not allowed; {allowed}")


def _int(doc: dict, key: str, source: str, *, required: bool = True) -> int | None:
    if key not in doc or doc[key] is None:
        if required:
            raise ConfigError(f"{source}: the key {key!r} is missing; a decoder config needs it "
                              "(a positive integer)")
        return None
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _err(source, key, v, "expected a positive integer")
    return v


def _bool(doc: dict, key: str, source: str, default: bool) -> bool:
    v = doc.get(key, default)
    if not isinstance(v, bool):
        raise _err(source, key, v, "expected true or false")
    return v


def _share(doc: dict, key: str, default: float, source: str) -> float:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise _err(source, key, v, "expected a share above 0 and at most 1")
    return float(v)


def _prob(doc: dict, key: str, source: str) -> float:
    v = doc.get(key, 0.0)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise _err(source, key, v, "expected a probability in [0, 1)")
    return float(v)


def _model_type(doc: dict, source: str) -> str:
    mt = doc.get("model_type")
    if mt is None:  # old files: infer from the key style
        mt = "gpt2" if "n_embd" in doc else "mixtral" if "num_local_experts" in doc else "llama"
    if not isinstance(mt, str) or mt not in MODEL_TYPES:
        raise _err(source, "model_type", mt, f"supported: {', '.join(MODEL_TYPES)}")
    return mt


def _activation(doc: dict, key: str, default: str, source: str) -> str:
    act = doc.get(key, default)
    if act not in ACTIVATIONS:
        raise _err(source, key, act, f"allowed: {', '.join(ACTIVATIONS)}")
    return act


def _sizes(doc: dict, mt: str, source: str) -> dict:
    (k_layers, k_hidden, k_heads, k_ffn, k_pos), fixed = MODEL_TYPES[mt]
    hidden = _int(doc, k_hidden, source)
    fields = dict(fixed, layers=_int(doc, k_layers, source), hidden=hidden,
                  heads=_int(doc, k_heads, source), vocab=_int(doc, "vocab_size", source))
    if mt == "gpt2":
        fields["ffn"] = _int(doc, k_ffn, source, required=False) or 4 * hidden
        fields["max_positions"] = _int(doc, k_pos, source)
        fields["activation"] = _activation(doc, "activation_function", "gelu_new", source)
        if fields["activation"] == "relu2":   # squared ReLU is the nemotron family's alone
            raise _err(source, "activation_function", "relu2", "allowed with model_type "
                       f"gpt2: {', '.join(a for a in ACTIVATIONS if a != 'relu2')} (squared "
                       "ReLU is modelled for model_type nemotron)")
        fields["dropout"] = any(_prob(doc, k, source) > 0
                                for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    else:
        fields["ffn"] = _int(doc, k_ffn, source)
        fields["max_positions"] = _int(doc, k_pos, source, required=False)
        fields["activation"] = _activation(doc, "hidden_act",
                                           "relu2" if mt == "nemotron" else "silu", source)
        fields["kv_heads"] = _int(doc, "num_key_value_heads", source, required=False)
        fields["head_dim"] = _int(doc, "head_dim", source, required=False)
    fields["tied_embeddings"] = _bool(doc, "tie_word_embeddings", source,
                                      fixed["tied_embeddings"])
    if mt == "nemotron":
        fields["rotary_share"] = _share(doc, "partial_rotary_factor", 0.5, source)
    if mt in ("llama", "mistral", "mixtral", "qwen3", "qwen3_moe", "nemotron"):
        bias = _bool(doc, "attention_bias", source, False)
        fields.update(qkv_bias=bias, out_bias=bias, mlp_bias=_bool(doc, "mlp_bias", source, False))
    fields.update(_window(doc, mt, fields["layers"], source))
    if mt == "gpt_oss" and doc.get("swiglu_limit") is not None:
        # modeling_gpt_oss.py GptOssExperts: gate.clamp(max=limit), up.clamp(-limit, limit)
        fields["glu_clamp"] = float(doc["swiglu_limit"])
    if mt in _DEEPSEEK_TYPES:
        fields["mla"] = _mla(doc, source)
    return fields


def _mla(doc: dict, source: str) -> MLA:
    """DeepSeek-V3's attention sizes (:class:`~.mla.MLA`); ``q_lora_rank`` may be null."""
    return MLA(kv_lora_rank=_int(doc, "kv_lora_rank", source),
               qk_nope_head_dim=_int(doc, "qk_nope_head_dim", source),
               qk_rope_head_dim=_int(doc, "qk_rope_head_dim", source),
               v_head_dim=_int(doc, "v_head_dim", source),
               q_lora_rank=_int(doc, "q_lora_rank", source, required=False),
               bias=_bool(doc, "attention_bias", source, False))


#: layer_types entries (transformers' ``layer_type_validation``) with and without a window
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _window(doc: dict, mt: str, layers: int, source: str) -> dict:
    """``sliding_window`` and how many layers use it: those ``layer_types`` names
    ``sliding_attention`` (GPT-OSS); with Qwen2/Qwen3 the layers from ``max_window_layers``
    on, and only with ``use_sliding_window: true``; else all (Mistral, Mixtral)."""
    w = _int(doc, "sliding_window", source, required=False)
    types = doc.get("layer_types")
    if types is not None:
        if (not isinstance(types, list) or len(types) != layers
                or any(x not in _LAYER_TYPES for x in types)):
            raise _err(source, "layer_types", types, f"expected a list of {layers} entries "
                       f"(num_hidden_layers), each one of {', '.join(_LAYER_TYPES)}")
        n = types.count("sliding_attention")
    elif mt.startswith("qwen"):
        use = _bool(doc, "use_sliding_window", source, False)
        full = _int(doc, "max_window_layers", source, required=False) or 0
        n = max(0, layers - full) if use else 0
    else:
        n = layers
    if w is None or n == 0:
        if types is not None and n:
            raise ConfigError(f"{source}: layer_types names {n} sliding_attention layers but "
                              "sliding_window is missing; give the window in keys")
        return {}
    return {"sliding_window": w, "window_layers": n}


def _moe(doc: dict, mt: str, source: str) -> dict:
    if mt in ("mixtral", "gpt_oss"):   # GPT-OSS's experts are intermediate_size wide
        return dict(experts=_int(doc, "num_local_experts", source),
                    top_k=_int(doc, "num_experts_per_tok", source))
    if mt in _DEEPSEEK_TYPES:   # V3's router has e_score_correction_bias, V2's none
        return _deepseek_moe(doc, source, router_bias=mt == "deepseek_v3")
    if mt == "qwen3_moe":
        freq = _int(doc, "decoder_sparse_step", source, required=False) or 1
        return dict(experts=_int(doc, "num_experts", source),
                    top_k=_int(doc, "num_experts_per_tok", source),
                    expert_ffn=_int(doc, "moe_intermediate_size", source), moe_layer_freq=freq)
    if mt != "qwen2_moe":
        return {}
    shared = _int(doc, "shared_expert_intermediate_size", source, required=False)
    freq = _int(doc, "decoder_sparse_step", source, required=False) or 1
    return dict(experts=_int(doc, "num_experts", source), top_k=_int(doc, "num_experts_per_tok", source),
                expert_ffn=_int(doc, "moe_intermediate_size", source), moe_layer_freq=freq,
                shared_experts=1 if shared else 0, shared_expert_ffn=shared,
                shared_expert_gate=bool(shared))


#: DeepSeek's router keys read by :func:`.hf_router.router_balancing` (the model section's fields of the
#: same names, and ``router_aux_loss_coef`` for ``aux_loss_alpha``)
BALANCING_KEYS = ("aux_loss_alpha", "seq_aux", "scoring_func", "topk_method")

def _deepseek_moe(doc: dict, source: str, router_bias: bool) -> dict:
    """DeepSeek-V3's and V2's MoE fields (``modeling_deepseek_v3.py``,
    ``modeling_deepseek_v2.py``): ``n_routed_experts`` of ``moe_intermediate_size``,
    ``n_shared_experts`` of the same size (its shared MLP is one MLP of
    ``n_shared × moe_intermediate_size``: the same parameters and FLOPs), with
    ``router_bias`` V3's ``e_score_correction_bias`` (``E``; V2's gate has none), the first
    ``first_k_dense_replace`` layers dense."""
    freq = doc.get("moe_layer_freq", 1)
    if freq != 1:
        raise _err(source, "moe_layer_freq", freq, "only 1 (every layer past "
                   "first_k_dense_replace is an MoE layer) is modelled")
    first = doc.get("first_k_dense_replace", 0)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise _err(source, "first_k_dense_replace", first, "expected an integer >= 0")
    shared = doc.get("n_shared_experts") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise _err(source, "n_shared_experts", shared, "expected an integer >= 0")
    f_e = _int(doc, "moe_intermediate_size", source)
    return dict(experts=_int(doc, "n_routed_experts", source),
                top_k=_int(doc, "num_experts_per_tok", source), expert_ffn=f_e,
                shared_experts=shared, shared_expert_ffn=f_e if shared else None,
                first_dense_layers=first, router_bias=router_bias)


#: Expert keys, and the model types whose HuggingFace modelling code reads them
_MOE_KEYS = {"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "decoder_sparse_step", "n_routed_experts",
             "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
             "router_aux_loss_coef"}
_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "deepseek_v2", "gpt_oss")
#: Keys of :data:`_READ` that a model type's code may apply but ddlsim's family does not model:
#: Phi-3's dropouts (modeling_phi3.py: resid_attn_dropout and resid_mlp_dropout of
#: resid_pdrop; embd_pdrop, an embedding dropout some Phi-3 implementations apply, though
#: transformers 4.56's Phi3Model has none), told by :data:`.hf_keys.CONDITIONAL` when not
#: zero; Llama-style models ignore these keys.
_APPLIED_UNMODELLED = {"phi3": {"resid_pdrop", "embd_pdrop"}}


def _unmodelled(doc: dict, mt: str, source: str) -> list[str]:
    """Expert keys of a dense ``model_type`` (said: transformers ignores them), then the keys
    :func:`.hf_keys.unmodelled` reports (a value that changes the step, an unknown key)."""
    from .hf_keys import unmodelled

    out = []
    for key in doc:
        if key in _MOE_KEYS and mt not in _MOE_TYPES and doc[key]:
            out.append(f"{key}={doc[key]!r} (model_type {mt!r} has no experts: transformers' "
                       f"{mt} model ignores this key, so ddlsim counts a dense model; use "
                       f"model_type 'mixtral' for a Mixture-of-Experts model)")
    if "attention_dropout" in doc:
        _prob(doc, "attention_dropout", source)     # a probability, or refused
    read = (set(MODEL_TYPES[mt][0]) | _READ) - _APPLIED_UNMODELLED.get(mt, set())
    if mt in _DEEPSEEK_TYPES:    # the router's balancing (router_balancing)
        read |= set(BALANCING_KEYS)
    if mt == "nemotron":         # its rotary share (DecoderShape.rotary_share)
        read.add("partial_rotary_factor")
    return out + unmodelled(doc, read)


def from_hf_config(doc: dict, *, source: str) -> tuple[dict, list[str]]:
    """Normalise a HuggingFace ``config.json`` into :class:`DecoderShape` fields.

    Parameters
    ----------
    doc : dict
        The parsed ``config.json``, as published.
    source : str
        Where it came from (a path or a name), used in messages.

    Returns
    -------
    fields : dict
        Keyword arguments of :class:`~ddlsim.workloads.models.decoder.DecoderShape`.
    unmodelled : list of str
        Keys that may change a training step and that ddlsim does not model: expert keys of
        a model type without experts, then in file order a known key with a value that
        matters as ``key=value (note)`` and an unknown key by name; keys declared harmless
        (:mod:`.hf_keys`) are left out. Meant for one warning line.

    Raises
    ------
    ConfigError
        Not a mapping, an unsupported ``model_type``, a missing essential key or a value of
        the wrong type, naming the key, the value and what is allowed.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a HuggingFace config.json must be a JSON object, "
                          f"got {type(doc).__name__}")
    mt = _model_type(doc, source)
    fields = _sizes(doc, mt, source)
    fields.update(_moe(doc, mt, source))
    try:
        DecoderShape(**fields)  # cross-field rules (heads vs kv heads, top-k vs experts, …)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return fields, _unmodelled(doc, mt, source)


def read_hf_config(path: str | Path) -> tuple[dict, list[str]]:
    """Read a ``config.json`` file and normalise it with :func:`from_hf_config`.

    Duplicate keys and ``NaN``/``Infinity`` are refused with a :class:`ConfigError`; the file
    itself is read by :func:`ddlsim.textio.read_text` (bounded, UTF-8, regular files only).
    """
    from ...textio import read_text

    from ...documents import parse_json

    text = read_text(path, what="HuggingFace config.json")
    return from_hf_config(parse_json(text, f"HuggingFace config.json {str(path)!r}"),
                          source=str(path))
