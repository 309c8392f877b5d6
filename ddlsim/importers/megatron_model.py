"""The model section a Megatron-LM command line means: family, vocabulary, GQA, biases,
virtual pipeline stages, dropout, from the flags :mod:`.megatron` set aside.

Megatron-LM's rules used here (``megatron/training/arguments.py`` unless said):

* ``pretrain_gpt.py`` passes ``args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}``; the
  GPT-2 BPE vocabulary has 50,257 tokens (Radford et al. 2019), padded up to a multiple of
  ``--make-vocab-size-divisible-by`` (default 128) × TP (``_vocab_size_with_padding``);
* ``--swiglu`` without ``--ffn-hidden-size``: ``int((4·h·2/3) / 64) · 64``; without
  ``--swiglu``: ``4·h``;
* ``--num-query-groups`` applies only with ``--group-query-attention`` (default 1 group);
* embeddings are tied unless ``--untie-embeddings-and-output-weights``;
* ``--num-layers-per-virtual-pipeline-stage L``: ``layers / PP / L`` virtual stages (the
  embedding and the loss counted as a layer each where the split accounts for them);
* ``--attention-dropout`` and ``--hidden-dropout`` default to 0.1; ``--moe-router-topk`` to 2;
* ``--sequence-parallel`` is turned off when TP is 1 (``validate_args``).
"""

from __future__ import annotations

from .common import Draft
from .megatron_moe_model import moe_model_fields

__all__ = ["model_fields"]

GPT2_BPE_VOCAB = 50257      # Radford et al. 2019; Megatron-LM GPT2BPETokenizer
VOCAB_DIVISOR = 128         # arguments.py: --make-vocab-size-divisible-by default
DROPOUT_DEFAULT = "0.1"     # arguments.py: --attention-dropout, --hidden-dropout defaults


def _one_value(draft: Draft, model: dict, flag: str, default: str | None) -> str | None:
    values = model.get(flag)
    if values is None:
        return default
    if len(values) != 1:
        draft.refuse(f"--{flag} {' '.join(values)}", f"expects one value, got {len(values)}")
        return default
    return values[0]


#: ``--normalization`` as Megatron-LM (``LayerNorm``, ``RMSNorm``) and Megatron-DeepSpeed
#: (4efb479d megatron/arguments.py line 647: ``layernorm``, ``rmsnorm``) spell it
NORMS = {"LayerNorm": "LayerNorm", "layernorm": "LayerNorm", "RMSNorm": "RMSNorm",
         "rmsnorm": "RMSNorm"}


def _architecture(draft: Draft, model: dict) -> str | None:
    """``gpt`` or ``llama`` from the normalisation, positions and MLP flags (Megatron-
    DeepSpeed's ``--use-rotary-position-embeddings``, 4efb479d arguments.py line 633, is
    rope)."""
    norm = _one_value(draft, model, "normalization", "LayerNorm")
    norm = NORMS.get(norm, norm)
    rope = "use-rotary-position-embeddings" in model
    pos = _one_value(draft, model, "position-embedding-type", "rope" if rope else
                     "learned_absolute")
    if rope and pos != "rope":
        draft.refuse("--use-rotary-position-embeddings", f"contradicts "
                     f"--position-embedding-type {pos}")
    _no_position_embedding(draft, model, pos)
    gated = "swiglu" in model
    squared = "squared-relu" in model
    if (norm, pos, gated, squared) == ("LayerNorm", "learned_absolute", False, False):
        return "gpt"
    if (norm, pos, gated, squared) == ("RMSNorm", "rope", True, False):
        return "llama"
    if (norm, pos, gated, squared) == ("LayerNorm", "rope", False, True):
        return "nemotron"
    draft.refuse(f"--normalization {norm} --position-embedding-type {pos}"
                 + (" --swiglu" if gated else "") + (" --squared-relu" if squared else ""),
                 "ddlsim's decoder families are gpt (LayerNorm, learned_absolute positions, "
                 "GeLU MLP), llama (RMSNorm, rope, --swiglu) and nemotron (LayerNorm, rope, "
                 "--squared-relu); this mix is none of them (not modelled yet)")
    return None


def _rotary_percent(draft: Draft, model: dict, arch: str | None) -> None:
    """``--rotary-percent``: the nemotron family's ``partial_rotary_factor``; the others
    rotate every head dimension (1.0, Megatron's default)."""
    if "rotary-percent" not in model or arch is None:
        return
    value = _one_value(draft, model, "rotary-percent", "1.0")
    arg = f"--rotary-percent {value}"
    try:
        share = float(value)
    except ValueError:
        draft.refuse(arg, "expects a share above 0 and at most 1")
        return
    if arch == "nemotron" and 0 < share <= 1:
        draft.set("model.partial_rotary_factor", share, arg)
    elif share == 1:
        draft.note(arg, "every head dimension rotated, as the family models RoPE")
    else:
        draft.refuse(arg, f"the {arch} family rotates every head dimension (allowed: 1.0; "
                          "a share below 1 with the nemotron family's --squared-relu layers)")


def model_fields(draft: Draft, model: dict, script: str | None) -> None:
    """Complete ``draft``'s model and plan fields from the flags in ``model``."""
    if script is not None:
        if script.rsplit("/", 1)[-1] == "pretrain_gpt.py":
            draft.note(script, "the decoder-only GPT model of Megatron-LM")
        else:
            draft.refuse(script, "ddlsim reads pretrain_gpt.py's decoder (GPT, Llama-style "
                                 "and MoE layers) only")
    f = draft.fields
    arch = _architecture(draft, model)
    _rotary_percent(draft, model, arch)
    if arch is None:
        return
    f["model.architecture"] = arch
    flags = "--normalization/--position-embedding-type/--swiglu/--squared-relu" + (
        "/--use-rotary-position-embeddings" if "use-rotary-position-embeddings" in model else "")
    draft.note(flags, f"model.architecture: {arch}")
    _gqa(draft, model, arch)
    _biases(draft, model, arch)
    moe_model_fields(draft, model)        # MLA, the MoE layers' pattern, shared experts
    if arch == "llama" and "model.intermediate_size" not in f and "model.hidden_size" in f:
        h = f["model.hidden_size"]
        draft.set("model.intermediate_size", int((4 * h * 2 / 3) / 64) * 64,
                  "--swiglu without --ffn-hidden-size (Megatron's default)")
    if arch == "nemotron" and "model.intermediate_size" not in f and "model.hidden_size" in f:
        draft.set("model.intermediate_size", 4 * f["model.hidden_size"],
                  "no --ffn-hidden-size (Megatron's default 4·hidden)")
    if "model.tie_word_embeddings" not in f:
        draft.set("model.tie_word_embeddings", True, "no --untie-embeddings-and-output-weights")
    if "model.max_position_embeddings" not in f and "train.seq_length" in f:
        draft.set("model.max_position_embeddings", f["train.seq_length"],
                  "no --max-position-embeddings (the positions the run reaches)")
    if f.get("model.num_local_experts") and "model.num_experts_per_tok" not in f:
        draft.set("model.num_experts_per_tok", 2, "no --moe-router-topk (default 2)")
    _vocab(draft, model)
    _fp8(draft, model)
    if f.get("parallel.sequence_parallel") and f.get("parallel.tensor_model_parallel_size",
                                                      1) == 1:
        del f["parallel.sequence_parallel"]     # Megatron's validate_args turns it off
        draft.notes = [n for n in draft.notes if n[0] != "--sequence-parallel"]
        draft.note("--sequence-parallel", "off: Megatron disables sequence parallelism when "
                                          "tensor parallelism is 1 (arguments.py)")
    _dropout(draft, model, arch)
    _virtual_stages(draft, model)
    if "recompute-num-layers" in model:
        draft.note(f"--recompute-num-layers {' '.join(model['recompute-num-layers'])}",
                   "with --recompute-method uniform every layer is recomputed (in groups)")


def _no_position_embedding(draft: Draft, model: dict, pos: str) -> None:
    """``--no-position-embedding`` (Megatron-LM d98e8a64 arguments.py line 2437: deprecated
    for ``--position-embedding-type``): no learned position table, as rope has none."""
    if "no-position-embedding" not in model:
        return
    if pos == "rope":
        draft.note("--no-position-embedding", "no learned position table, as "
                                              "--position-embedding-type rope has none")
    else:
        draft.refuse("--no-position-embedding", f"a decoder without positions is not modelled "
                                                f"(--position-embedding-type {pos}); with "
                                                "rope it is accepted")


def _gqa(draft: Draft, model: dict, arch: str) -> None:
    f = draft.fields
    kv = _one_value(draft, model, "num-key-value-heads", None)
    if kv is not None:          # Megatron-DeepSpeed 4efb479d arguments.py lines 623, 444-449
        try:
            draft.set("model.num_key_value_heads", int(kv), f"--num-key-value-heads {kv}")
        except ValueError:
            draft.refuse(f"--num-key-value-heads {kv}", "expects a whole number")
        return
    if "group-query-attention" in model:
        f.setdefault("model.num_key_value_heads", 1)
    elif "model.num_key_value_heads" in f:
        del f["model.num_key_value_heads"]
        draft.note("--num-query-groups", "no effect: Megatron reads it only with "
                                         "--group-query-attention")
    if arch == "gpt":
        for path, flag in (("model.num_key_value_heads", "--group-query-attention"),
                           ("model.head_dim", "--kv-channels")):
            if path in f:
                draft.refuse(flag, "ddlsim's gpt family has multi-head attention of head size "
                                   "hidden/heads (use the llama family's flags: --normalization "
                                   "RMSNorm --position-embedding-type rope --swiglu)")
                del f[path]


def _biases(draft: Draft, model: dict, arch: str) -> None:
    no_bias = "disable-bias-linear" in model
    if arch == "gpt" and no_bias:
        draft.refuse("--disable-bias-linear", "ddlsim's gpt family has biases (not modelled "
                                              "yet without them)")
    elif arch in ("llama", "nemotron"):
        for path in ("model.attention_bias", "model.mlp_bias"):
            draft.set(path, not no_bias, "--disable-bias-linear" if no_bias
                      else "no --disable-bias-linear (Megatron's linear layers have biases)")


def _vocab(draft: Draft, model: dict) -> None:
    """Megatron's padded vocabulary: ``_vocab_size_with_padding``."""
    given = _one_value(draft, model, "vocab-size", None)
    tokenizer = _one_value(draft, model, "tokenizer-type", "GPT2BPETokenizer")
    divisor = _one_value(draft, model, "make-vocab-size-divisible-by", str(VOCAB_DIVISOR))
    if given is None and tokenizer != "GPT2BPETokenizer":
        draft.refuse(f"--tokenizer-type {tokenizer}", "ddlsim cannot read a tokenizer: add "
                                                      "--vocab-size N (its vocabulary) to the "
                                                      "arguments, or import with --ignore "
                                                      "tokenizer-type --set "
                                                      "model.vocab_size=N (N padded as "
                                                      "Megatron pads it)")
        return
    try:
        vocab, divisor_n = int(given or GPT2_BPE_VOCAB), int(divisor)
    except ValueError:
        draft.refuse(f"--vocab-size {given} --make-vocab-size-divisible-by {divisor}",
                     "expects whole numbers")
        return
    multiple = divisor_n * draft.fields.get("parallel.tensor_model_parallel_size", 1)
    padded = -(-vocab // multiple) * multiple
    why = (f"--vocab-size {given}" if given else f"--tokenizer-type {tokenizer} "
           f"({GPT2_BPE_VOCAB} tokens)") + f" padded to a multiple of {divisor_n}×TP"
    draft.set("model.vocab_size", padded, why)


def _fp8(draft: Draft, model: dict) -> None:
    """``--fp8-format`` with ``--bf16``: FP8 GEMMs over bf16 parameters, ddlsim's ``fp8``."""
    fmt = _one_value(draft, model, "fp8-format", None)
    if fmt is None:
        return
    arg = f"--fp8-format {fmt}"
    if fmt not in ("hybrid", "e4m3"):
        draft.refuse(arg, "ddlsim models --fp8-format hybrid or e4m3")
    elif draft.fields.get("train.dtype", "bf16") != "bf16":
        draft.refuse(arg, f"FP8 over {draft.fields['train.dtype']} parameters is not modelled "
                          "(ddlsim's fp8 keeps bf16 parameters: give --bf16)")
    else:
        draft.fields["train.dtype"] = "fp8"
        draft.note(arg, "train.dtype: 'fp8' (FP8 GEMMs, bf16 elsewhere)")


def _dropout(draft: Draft, model: dict, arch: str) -> None:
    """The gpt family counts dropout's kernels and masks; the llama family has none (a
    Llama-style script that leaves Megatron's default 0.1 is told, once, what recipes set)."""
    hint = ("; Megatron's Llama recipes set --attention-dropout 0.0 --hidden-dropout 0.0: "
            "add them if this run does too")
    for flag in ("attention-dropout", "hidden-dropout"):
        value = _one_value(draft, model, flag, DROPOUT_DEFAULT)
        try:
            on = float(value) > 0
        except ValueError:
            draft.refuse(f"--{flag} {value}", "expects a probability")
            continue
        arg = f"--{flag} {value}" + ("" if flag in model else " (Megatron's default)")
        if on == (arch == "gpt"):
            draft.note(arg, f"as the {arch} family models it")
        else:
            unset = "" if flag in model or arch != "llama" else hint
            hint = hint if not unset else ""
            draft.refuse(arg, f"the {arch} family models "
                              f"{'dropout on' if arch == 'gpt' else 'no dropout'}; this run "
                              f"has {'it' if on else 'none'} (not modelled yet){unset}")


def _virtual_stages(draft: Draft, model: dict) -> None:
    """``--num-layers-per-virtual-pipeline-stage L``: ``(layers + e + l) / PP / L`` virtual
    stages, ``e`` and ``l`` 1 with ``--account-for-embedding/loss-in-pipeline-split`` (Megatron-LM
    d98e8a64 arguments.py validate_args: ``num_layers += 1`` for each before the division)."""
    f = draft.fields
    per = _one_value(draft, model, "num-layers-per-virtual-pipeline-stage", None)
    if per is not None:
        layers = f.get("model.num_hidden_layers", 0) + sum(
            bool(f.get(f"parallel.account_for_{part}_in_pipeline_split"))
            for part in ("embedding", "loss"))
        pp = f.get("parallel.pipeline_model_parallel_size", 1)
        arg = f"--num-layers-per-virtual-pipeline-stage {per}"
        if not per.isdigit() or int(per) == 0 or layers % (pp * int(per)):
            draft.refuse(arg, f"{layers} layers (with the embedding and loss where the split "
                              f"accounts for them) / PP {pp} is not a whole number of groups "
                              f"of {per} layers")
        else:
            draft.set("parallel.virtual_pipeline_model_parallel_size",
                      layers // pp // int(per), arg)
    if f.get("parallel.virtual_pipeline_model_parallel_size", 1) > 1:
        draft.set("parallel.schedule", "interleaved", "virtual pipeline stages")
