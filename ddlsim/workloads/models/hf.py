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
attention sinks, sliding-window attention on the layers ``layer_types`` names). What each
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
           "router_aux_loss_coef", "router_groups", "router_balancing", "BALANCING_KEYS"]

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
    # modeling_gpt_oss.py: q/k/v/o biases (the config class sets attention_bias = True), expert
    # biases (gate_up_proj_bias, down_proj_bias), a router bias and one sink per head
    "gpt_oss": (_LLAMA_KEYS, dict(_ROTARY_GATED, qkv_bias=True, out_bias=True, mlp_bias=True,
                                  router_bias=True, attention_sinks=True, tied_embeddings=False)),
}

#: The model types of DeepSeek's Multi-head Latent Attention and DeepSeekMoE layers
_DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v2")

#: Activations HuggingFace's ACT2FN knows that these architectures use.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu",
               "silu", "swish")

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
        fields["dropout"] = any(_prob(doc, k, source) > 0
                                for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    else:
        fields["ffn"] = _int(doc, k_ffn, source)
        fields["max_positions"] = _int(doc, k_pos, source, required=False)
        fields["activation"] = _activation(doc, "hidden_act", "silu", source)
        fields["kv_heads"] = _int(doc, "num_key_value_heads", source, required=False)
        fields["head_dim"] = _int(doc, "head_dim", source, required=False)
    fields["tied_embeddings"] = _bool(doc, "tie_word_embeddings", source,
                                      fixed["tied_embeddings"])
    if mt in ("llama", "mistral", "mixtral", "qwen3", "qwen3_moe"):
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


def router_aux_loss_coef(doc: dict, source: str) -> float | None:
    """The load-balancing loss coefficient of an MoE ``config.json`` (``router_aux_loss_coef``:
    transformers' Mixtral, Qwen2/3-MoE and GPT-OSS models add it times the loss to the
    training loss), or None when the file has none, describes a dense model, or leaves
    ``output_router_logits`` false: those models compute the loss only under it
    (huggingface/transformers ``models/mixtral/modeling_mixtral.py``,
    ``MixtralForCausalLM.forward``: ``if output_router_logits: aux_loss =
    load_balancing_loss_func(...)``, then ``loss += self.router_aux_loss_coef * aux_loss``;
    the flag's default is the config's), so a published file with it false trains without one.

    Raises
    ------
    ConfigError
        When it is not a number >= 0.
    """
    value = doc.get("router_aux_loss_coef")
    if value is None or _model_type(doc, source) not in _MOE_TYPES:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise _err(source, "router_aux_loss_coef", value, "a number >= 0")
    return float(value) if doc.get("output_router_logits") is True else None


#: DeepSeek's router selection rules that limit each token to ``topk_group`` of ``n_group``
#: expert groups (transformers 4.56 ``modeling_deepseek_v2.py``
#: ``DeepseekV2Moe.route_tokens_to_experts``: ``group_limited_greedy``; ``modeling_deepseek_v3.py``
#: ``DeepseekV3MoE.route_tokens_to_experts``: always, the ``noaux_tc`` rule of V3's
#: ``modeling_deepseek.py``); ``greedy`` (DeepSeek-V2-Lite) picks over all experts
_GROUP_LIMITED = ("group_limited_greedy", "noaux_tc")


def router_groups(doc: dict, source: str) -> tuple[int, int] | None:
    """``(n_group, topk_group)`` of a DeepSeek ``config.json`` whose router limits each token
    to ``topk_group`` of ``n_group`` expert groups (``topk_method`` ``group_limited_greedy``,
    V2; ``noaux_tc``, V3), read as the default of ``parallel.moe.router_num_groups`` and
    ``router_group_topk``; None when it does not (no groups, one group, every group allowed,
    ``greedy``, or another model type).

    Raises
    ------
    ConfigError
        When ``n_group`` does not divide ``n_routed_experts``, or ``topk_group`` is not between
        1 and ``n_group`` or holds fewer experts than ``num_experts_per_tok``.
    """
    mt = _model_type(doc, source)
    if mt not in _DEEPSEEK_TYPES:
        return None
    # V3's router always limits the groups (its remote code has noaux_tc only)
    method = "noaux_tc" if mt == "deepseek_v3" else doc.get("topk_method", "greedy")
    groups = _int(doc, "n_group", source, required=False)
    allowed = _int(doc, "topk_group", source, required=False)
    if method not in _GROUP_LIMITED or groups in (None, 1) or allowed is None:
        return None
    experts = _int(doc, "n_routed_experts", source)
    top_k = _int(doc, "num_experts_per_tok", source)
    if experts % groups:
        raise _err(source, "n_group", groups, f"a divisor of n_routed_experts = {experts} "
                   "(each group holds as many consecutive experts)")
    if allowed > groups or allowed * (experts // groups) < top_k:
        raise _err(source, "topk_group", allowed, f"between 1 and n_group = {groups}, its "
                   f"groups holding at least num_experts_per_tok = {top_k} experts")
    return None if allowed == groups else (groups, allowed)


#: DeepSeek's router keys read by :func:`router_balancing` (the model section's fields of the
#: same names, and ``router_aux_loss_coef`` for ``aux_loss_alpha``)
BALANCING_KEYS = ("aux_loss_alpha", "seq_aux", "scoring_func", "topk_method")
#: ``topk_method`` values of DeepSeek's remote code (DeepSeek-V2 ``modeling_deepseek.py``
#: ``MoEGate``: greedy, group_limited_greedy; DeepSeek-V3's: noaux_tc) and ``scoring_func``
#: values (V2: softmax; V3: sigmoid)
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
_SCORING = ("softmax", "sigmoid")


def router_balancing(doc: dict, source: str) -> dict:
    """How a DeepSeek ``config.json``'s router balances, as model-section fields: the defaults
    of ``parallel.moe.router_score_function`` (``scoring_func``),
    ``router_enable_expert_bias`` (``topk_method: noaux_tc``: the ``e_score_correction_bias``
    of auxiliary-loss-free balancing), ``router_load_balancing_type`` (``seq_aux: true``:
    seq_aux_loss) and ``aux_loss_coeff`` (``aux_loss_alpha``, as ``router_aux_loss_coef``);
    empty for other model types.

    DeepSeek-V2's remote ``MoEGate`` computes the balance loss in training when
    ``aux_loss_alpha > 0``, per sequence under ``seq_aux``; V3's remote gate is inference
    code (``noaux_tc`` asserts ``not self.training``), so its training is the V3 report's:
    the expert bias with a sequence-wise loss of a small α (arXiv:2412.19437 §2.1.2; §4.2:
    α = 0.0001, the published config.json says 0.001), as Megatron-Bridge's
    ``DeepSeekV3ModelProvider`` runs it (seq_aux_loss, sigmoid, expert bias, rate 1e-3,
    coefficient 1e-4). The file's coefficient is read: at either value the loss's kernels
    are the same and the bias's statistic sets the load (:mod:`~ddlsim.workloads.decoder.
    moe_balance`). V3 always routes with ``noaux_tc`` (as :func:`router_groups`).

    Raises
    ------
    ConfigError
        A ``topk_method``, ``scoring_func``, ``seq_aux`` or ``aux_loss_alpha`` of the wrong
        kind or value, naming key, value and what is allowed.
    """
    mt = _model_type(doc, source)
    if mt not in _DEEPSEEK_TYPES:
        return {}
    method = "noaux_tc" if mt == "deepseek_v3" else doc.get("topk_method", "greedy")
    if method not in _TOPK_METHODS:
        raise _err(source, "topk_method", method, f"one of {', '.join(_TOPK_METHODS)}")
    scoring = doc.get("scoring_func", "softmax")
    if scoring not in _SCORING:
        raise _err(source, "scoring_func", scoring, f"one of {', '.join(_SCORING)}")
    alpha = doc.get("aux_loss_alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise _err(source, "aux_loss_alpha", alpha, "a number >= 0")
    out = {"scoring_func": scoring, "topk_method": method}
    if alpha > 0:
        out.update(router_aux_loss_coef=float(alpha),
                   seq_aux=_bool(doc, "seq_aux", source, False))
    return out


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
