"""Which keys of a HuggingFace ``config.json`` could change a training step, and which cannot.

:mod:`.hf` reads the keys that size the model. Every other key of a published file is either
declared here as having no effect on the time or the memory of a training step
(:data:`NO_EFFECT`, each with the reason), or declared as changing the step only with some
values (:data:`CONDITIONAL`: the values that change nothing, and what ddlsim does not model
when the file holds another), or unknown. :func:`unmodelled` lists the keys a user must be
told about: a conditional key with a value that matters, and every unknown key (ddlsim cannot
say it is harmless). A key is never dropped silently unless this module says why it may be.

What each key does is read from HuggingFace transformers 4.56 (``configuration_<type>.py``
and ``modeling_<type>.py`` of llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe,
gpt2, gpt_oss, deepseek_v3, deepseek_v2, phi3) and, for DeepSeek's remote code, from
``modeling_deepseek.py`` of huggingface.co/deepseek-ai/DeepSeek-V3 (``MoEGate``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NO_EFFECT", "CONDITIONAL", "unmodelled", "SUPERSEDED_BY"]

_TOKENS = "a token id: which row of the embedding is special, not the embedding's size"
_EPS = "the norm's epsilon, added inside the same norm kernel"
_ROTARY = ("how the rotary angles are made (base, long-context scaling: linear, dynamic, "
           "llama3, yarn, longrope): the angles are computed once per sequence and applied "
           "by the same rotary kernel")
_SUMMARY = ("GPT2DoubleHeadsModel's sequence-summary head; the causal-LM model ddlsim counts "
            "has none")

#: Keys that change neither the time nor the memory of a training step, and why.
NO_EFFECT: dict[str, str] = {
    "_name_or_path": "the repository the file was saved from (ddlsim names the model after it)",
    "architectures": "the model class (…ForCausalLM, GPT2LMHeadModel): the causal-LM head "
                     "every model_type ddlsim reads is counted as",
    "auto_map": "the classes of the repository's own modelling code (the same layers)",
    "bos_token_id": _TOKENS, "eos_token_id": _TOKENS, "pad_token_id": _TOKENS,
    "initializer_range": "the standard deviation of the initial weights",
    "rms_norm_eps": _EPS, "layer_norm_epsilon": _EPS, "norm_eps": _EPS,
    "rope_theta": _ROTARY, "rope_scaling": _ROTARY,
    "initial_context_length": "GPT-OSS's context before YaRN scaling: " + _ROTARY,
    "original_max_position_embeddings": "Phi-3's context before its long-context (longrope) "
                                        "scaling: " + _ROTARY,
    "n_ctx": "GPT-2's old name of the context length; n_positions is read",
    "torch_dtype": "the dtype the checkpoint is stored in; a run computes in train.dtype",
    "transformers_version": "the library version that wrote the file",
    "use_cache": "the key/value cache of generation; a training step keeps none",
    "task_specific_params": "generation settings (sampling, lengths)",
    "summary_activation": _SUMMARY, "summary_first_dropout": _SUMMARY,
    "summary_proj_to_labels": _SUMMARY, "summary_type": _SUMMARY, "summary_use_proj": _SUMMARY,
    "ep_size": "the expert-parallel size of DeepSeek's inference code; a run's is "
               "parallel.expert_model_parallel_size",
    "routed_scaling_factor": "a constant times each token's k routing weights (k numbers per "
                             "token, applied in the experts' combine)",
    "norm_topk_prob": "whether each token's k routing weights are renormalised (k numbers per "
                      "token)",
    # DeepSeek's router keys: read for deepseek_v2/v3 (hf_router.router_balancing: parallel.moe's
    # balancing defaults); no other model type's code reads them
    "scoring_func": "DeepSeek's router score function, read for DeepSeek's model types only "
                    "(parallel.moe.router_score_function's default); this model type's code "
                    "does not read it",
    "topk_method": "DeepSeek's router selection rule, read for DeepSeek's model types only "
                   "(group limits: hf_router.router_groups; noaux_tc's expert bias: "
                   "hf_router.router_balancing); this model type's code does not read it",
    "seq_aux": "the form of DeepSeek's balance loss, read for DeepSeek's model types only "
               "(hf_router.router_balancing); this model type's code does not read it",
    "aux_loss_alpha": "DeepSeek's balance-loss coefficient, read for DeepSeek's model types "
                      "only (hf_router.router_balancing: parallel.moe.aux_loss_coeff's default); this "
                      "model type's code does not read it",
    "output_router_logits": "whether the load-balancing loss is computed: read with "
                            "router_aux_loss_coef (parallel.moe.aux_loss_coeff's default)",
}

#: config.json keys that a model-section field decides once the section sets it: the file's
#: value is then not what the run uses, so it is not reported (``num_nextn_predict_layers``:
#: ``model.mtp_num_layers``, the depth the run trains, Megatron's ``--mtp-num-layers``)
SUPERSEDED_BY: dict[str, str] = {"num_nextn_predict_layers": "mtp_num_layers"}

#: (value that changes nothing, what ddlsim does not model otherwise) per key
_Rule = tuple[Callable[[Any, dict], bool], str]


def _zero(value: Any, doc: dict) -> bool:
    return value in (None, 0, 0.0, False, [], {})


#: Keys that change a step with some values: the test for a value that does not, and what
#: ddlsim does not model when the file holds another one.
CONDITIONAL: dict[str, _Rule] = {
    "attention_dropout": (_zero, "attention dropout not modelled for this architecture"),
    "num_nextn_predict_layers": (_zero, "DeepSeek-V3's multi-token prediction depth, not "
                                        "taken from the file (Megatron's --mtp-num-layers "
                                        "defaults to none): the iteration trains the main "
                                        "model only unless model.mtp_num_layers is set "
                                        "(workloads/decoder/mtp.py)"),
    "mlp_only_layers": (_zero, "per-layer dense/MoE list not modelled: MoE layers follow "
                               "decoder_sparse_step only"),
    "pretraining_tp": (lambda v, doc: v in (None, 1),
                       "transformers splits each linear layer into pretraining_tp slices (the "
                       "same FLOPs in smaller GEMMs); not modelled"),
    "quantization_config": (_zero, "the checkpoint's weights are stored quantized; ddlsim "
                                   "trains the model in train.dtype and models no quantized "
                                   "weights"),
    "attn_logit_softcapping": (_zero, "tanh soft-capping of the attention scores not modelled"),
    "final_logit_softcapping": (_zero, "tanh soft-capping of the logits not modelled"),
    "router_jitter_noise": (_zero, "router jitter (a random factor on the router's input) not "
                                   "modelled"),
    "use_mrope": (_zero, "multimodal rotary sections not modelled"),
    "partial_rotary_factor": (lambda v, doc: v in (None, 1, 1.0),
                              "rotary embedding over a fraction of each head not modelled: its "
                              "kernels are counted over the whole head"),
    # Phi-3's dropouts (modeling_phi3.py; hf._APPLIED_UNMODELLED): read as harmless elsewhere
    "resid_pdrop": (_zero, "Phi-3's residual dropout (after attention and after the MLP) not "
                           "modelled: the llama family's layers have none"),
    "embd_pdrop": (_zero, "embedding dropout not modelled"),
    "experts_per_token": (lambda v, doc: v == doc.get("num_experts_per_tok"),
                          "differs from num_experts_per_tok, which is the one read"),
}


def _shown(value: Any, most: int = 40) -> str:
    """``value`` for the warning line: a quantization mapping by its method, else its repr
    cut to ``most`` characters."""
    if isinstance(value, dict) and "quant_method" in value:
        return f"{{'quant_method': {value['quant_method']!r}, …}}"
    text = repr(value)
    return text if len(text) <= most else text[:most - 1] + "…"


def unmodelled(doc: dict, read: set[str]) -> list[str]:
    """The keys of ``doc`` a user must be told about, in file order: a :data:`CONDITIONAL`
    key whose value changes the step, as ``key=value (what is not modelled)``, and every key
    neither ``read`` nor declared here, by name. Declared keys with a harmless value, and
    :data:`NO_EFFECT` keys, are left out."""
    out = []
    for key, value in doc.items():
        if key in read or key in NO_EFFECT:
            continue
        if key in CONDITIONAL:
            harmless, note = CONDITIONAL[key]
            if not harmless(value, doc):
                out.append(f"{key}={_shown(value)} ({note})")
            continue
        out.append(key)
    return out
