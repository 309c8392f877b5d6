"""torchtitan's model flavors (``[model] name`` and ``flavor``) → ddlsim model presets.

A flavor maps to a preset only where every dimension of the two is equal (layers, hidden,
heads, KV heads, head size, dense and expert FFN, vocabulary, tied embeddings, experts, top-k,
shared experts, QK norm): :data:`SHAPES` transcribes torchtitan's model args of each mapped
flavor, and ``tests/importers/test_torchtitan_flavors.py`` compares them, field by field, with
the preset's resolved model section. A flavor without an equal preset, or with something
ddlsim does not model, is refused by name with :data:`REFUSED`'s reason.

Sources: pytorch/torchtitan 238fa9953e4aec2a62582121564273d7cbb1e9f1 (the commit of the TOML
train configs, tests/importers/data/real/SOURCES.md): ``torchtitan/models/llama3/__init__.py``
(``llama3_args``), ``torchtitan/models/qwen3/__init__.py`` (``qwen3_args``) with the defaults
of ``qwen3/model/args.py`` (``enable_weight_tying = False``, ``attn_type = "sdpa"``,
``attn_mask_type = "causal"``), ``torchtitan/models/deepseek_v3/__init__.py``
(``deepseekv3_args``).
"""

from __future__ import annotations

__all__ = ["FLAVORS", "SHAPES", "REFUSED", "flavor_refusal"]

#: torchtitan model name → flavor → ddlsim model preset
FLAVORS: dict[str, dict[str, str]] = {
    "llama3": {"8B": "llama-3.1-8b", "70B": "llama-3.1-70b", "405B": "llama-3.1-405b"},
    "qwen3": {"8B": "qwen3-8b", "14B": "qwen3-14b", "32B": "qwen3-32b",
              "30B-A3B": "qwen3-30b-a3b", "235B-A22B": "qwen3-235b-a22b"},
}


def _qwen3(layers: int, dim: int, heads: int, kv: int, ffn: int, experts: int = 0,
           moe_ffn: int | None = None) -> dict:
    """A qwen3 flavor's args as ddlsim's model fields: head_dim 128, vocabulary 151,936, QK
    norm, untied (``enable_weight_tying`` default False), no biases; MoE flavors with 8 of
    ``experts`` routed experts and no shared one (``MoEArgs(top_k=8, num_shared_experts=0)``)."""
    shape = {"num_hidden_layers": layers, "hidden_size": dim, "num_attention_heads": heads,
             "num_key_value_heads": kv, "head_dim": 128, "intermediate_size": ffn,
             "vocab_size": 151936, "tie_word_embeddings": False, "qk_norm": True,
             "attention_bias": False, "mlp_bias": False, "num_local_experts": experts,
             "n_shared_experts": 0}
    if experts:
        shape.update(num_experts_per_tok=8, moe_intermediate_size=moe_ffn)
    return shape


#: (name, flavor) → torchtitan's args of each mapped qwen3 flavor, as ddlsim's model fields
#: (238fa99 qwen3/__init__.py: dim, n_layers, n_heads, n_kv_heads, head_dim, hidden_dim,
#: vocab_size, qk_norm, moe_inter_dim, MoEArgs num_experts/top_k/num_shared_experts)
SHAPES: dict[tuple[str, str], dict] = {
    ("qwen3", "8B"): _qwen3(36, 4096, 32, 8, 12288),
    ("qwen3", "14B"): _qwen3(40, 5120, 40, 8, 17408),
    ("qwen3", "32B"): _qwen3(64, 5120, 64, 8, 25600),
    ("qwen3", "30B-A3B"): _qwen3(48, 2048, 32, 4, 6144, experts=128, moe_ffn=768),
    ("qwen3", "235B-A22B"): _qwen3(94, 4096, 64, 4, 12288, experts=128, moe_ffn=1536),
}

_NO_PRESET = ("no ddlsim preset has this shape (the qwen3 presets are Qwen3-8B, 14B, 32B, "
              "30B-A3B and 235B-A22B)")
_FLEX = ("torchtitan runs this flavor's attention as FlexAttention with attn_mask_type "
         "'block_causal' (each document of a packed sequence attends within itself), which "
         "ddlsim does not model: its attention is causal over the whole sequence")

#: (name, flavor) → why a flavor torchtitan 238fa99 defines is not mapped
REFUSED: dict[tuple[str, str], str] = {
    ("qwen3", "0.6B"): f"dim 1024, 28 layers, tied embeddings: {_NO_PRESET}",
    ("qwen3", "1.7B"): f"dim 2048, 28 layers, tied embeddings: {_NO_PRESET}",
    ("qwen3", "4B"): f"dim 2560, 36 layers, tied embeddings: {_NO_PRESET}",
    ("qwen3", "debugmodel"): "a test model (dim 256, vocabulary 2,048) without a preset",
    ("qwen3", "debugmodel_moe"): "a test model (dim 256, vocabulary 2,048) without a preset",
    # 16B: vocab 102400, dim 2048, inter 10944, moe_inter 1408, 27 layers (1 dense), 16
    # heads, 64 experts (2 shared) top-6 softmax, q_lora_rank 0, kv_lora_rank 512: the shape
    # of DeepSeek-V2-Lite's config.json
    ("deepseek_v3", "16B"): f"{_FLEX} (its shape is DeepSeek-V2-Lite's: with causal attention "
                            "it is the deepseek-v2-lite preset)",
    ("deepseek_v3", "236B"): f"{_FLEX}; its routing is limited to 3 of 8 expert groups "
                             "(num_limited_groups), not modelled either",
    ("deepseek_v3", "671B"): f"{_FLEX} (torchtitan's DeepSeek-V3)",
}


def flavor_refusal(name: object, flavor: str) -> str:
    """Why ``[model] name``/``flavor`` is refused: :data:`REFUSED`'s reason where torchtitan
    defines the flavor, else the flavors ddlsim maps."""
    known = ", ".join(f"{n} {f}" for n in FLAVORS for f in FLAVORS[n])
    why = REFUSED.get((name, flavor)) if isinstance(name, str) else None
    return (f"{why}; " if why else "") + (
        f"ddlsim knows the flavors {known}; give the model with a Hugging Face folder or "
        "--set model=PRESET")
