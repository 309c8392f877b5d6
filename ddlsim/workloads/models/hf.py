"""HuggingFace ``config.json`` files, exactly as published, as :class:`DecoderShape` fields.

Covered styles (``model_type``): ``gpt2`` (``n_layer``, ``n_embd``, ``n_head``,
``n_positions``, ``n_inner``, ``activation_function``), ``llama``, ``mistral``, ``mixtral``
(``num_local_experts``, ``num_experts_per_tok``), ``qwen2`` (bias on q/k/v only) and
``qwen2_moe`` (``num_experts``, ``moe_intermediate_size``, one gated shared expert). What each
architecture fixes in code rather than in its config (gated MLP, norm, positions, biases) is
taken from the HuggingFace ``modeling_<type>.py`` of that architecture.

Keys that do not change performance (token ids, epsilons, initialisation, RoPE base and
scaling, dtype, versions, …) and keys ddlsim does not know are returned in a list, to be
reported once in a warning line, never as errors; keys that change the model but are not
modelled (sliding-window attention, …) are listed with a note saying so. Missing essential
keys and wrong types raise :class:`~ddlsim.errors.ConfigError` naming key, value and what is
allowed.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from .decoder import DecoderShape

__all__ = ["from_hf_config", "read_hf_config", "unmodelled_warning", "MODEL_TYPES"]

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
}

#: Activations HuggingFace's ACT2FN knows that these architectures use.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu",
               "silu", "swish")

#: Keys read on purpose, besides the per-style size keys.
_READ = {"model_type", "vocab_size", "num_key_value_heads", "head_dim", "hidden_act",
         "activation_function", "tie_word_embeddings", "attention_bias", "mlp_bias",
         "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
         "shared_expert_intermediate_size", "decoder_sparse_step", "resid_pdrop",
         "embd_pdrop", "attn_pdrop"}

#: Keys that change the model when set, and what ddlsim does instead.
_NOT_MODELLED = {
    "sliding_window": "sliding-window attention not modelled: attention cost and memory are "
                      "those of full causal attention",
    "mlp_only_layers": "per-layer dense/MoE list not modelled: MoE layers follow "
                       "decoder_sparse_step only",
    "attention_dropout": "attention dropout not modelled for this architecture",
}


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
    if mt in ("llama", "mistral", "mixtral"):
        bias = _bool(doc, "attention_bias", source, False)
        fields.update(qkv_bias=bias, out_bias=bias, mlp_bias=_bool(doc, "mlp_bias", source, False))
    return fields


def _moe(doc: dict, mt: str, source: str) -> dict:
    if mt == "mixtral":
        return dict(experts=_int(doc, "num_local_experts", source),
                    top_k=_int(doc, "num_experts_per_tok", source))
    if mt != "qwen2_moe":
        return {}
    shared = _int(doc, "shared_expert_intermediate_size", source, required=False)
    freq = _int(doc, "decoder_sparse_step", source, required=False) or 1
    return dict(experts=_int(doc, "num_experts", source), top_k=_int(doc, "num_experts_per_tok", source),
                expert_ffn=_int(doc, "moe_intermediate_size", source), moe_layer_freq=freq,
                shared_experts=1 if shared else 0, shared_expert_ffn=shared,
                shared_expert_gate=bool(shared))


def _active(doc: dict, mt: str, key: str, source: str) -> bool:
    """Whether a key of :data:`_NOT_MODELLED` changes this model."""
    if key == "sliding_window":
        default = mt not in ("qwen2", "qwen2_moe")   # Qwen2 applies it only when asked
        return doc[key] is not None and doc.get("use_sliding_window", default) is not False
    if key == "attention_dropout":
        return _prob(doc, key, source) > 0
    return bool(doc[key])


def _unmodelled(doc: dict, mt: str, source: str) -> list[str]:
    sizes = set(MODEL_TYPES[mt][0])
    out = []
    for key in doc:
        if key in sizes or key in _READ:
            continue
        if key in _NOT_MODELLED and _active(doc, mt, key, source):
            out.append(f"{key}={doc[key]!r} ({_NOT_MODELLED[key]})")
        else:
            out.append(key)
    return out


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
        Keys ddlsim does not model, in file order; those that change the model carry a
        note in parentheses. Meant for one warning line.

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


def unmodelled_warning(source: str, unmodelled: list[str]) -> str | None:
    """The one warning line listing what :func:`from_hf_config` did not model, or None."""
    if not unmodelled:
        return None
    return (f"{source}: {len(unmodelled)} config.json key(s) not modelled by ddlsim, ignored: "
            + ", ".join(unmodelled))


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
