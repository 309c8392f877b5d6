"""Megatron-LM launch arguments (a ``pretrain_gpt.py`` command line or script) → ddlsim fields.

Flag names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (and, for the
2021 flags ``--checkpoint-activations`` and ``--DDP-impl``, ``megatron/arguments.py`` of
6985e58, the SC'21 code). Every argument is mapped, declared without effect on one
iteration, accepted as not modelled, or refused by name (:mod:`.common`).
"""

from __future__ import annotations

from typing import Any

from .common import Draft
from .megatron_fsdp import FSDP_FLAGS, megatron_fsdp_flags
from .megatron_notes import (KNOWN_REFUSED, LAUNCHER, MORE_NO_EFFECT, MORE_NOT_MODELLED,
                             batch_schedule)
from .shell import is_unset, read_commands

__all__ = ["read_megatron", "read_megatron_command", "MEGATRON_FLAGS", "megatron_flag_names"]

#: flags with one value → the ddlsim field it sets (the value read as its type)
VALUE_FLAGS: dict[str, tuple[str, type]] = {
    "tensor-model-parallel-size": ("parallel.tensor_model_parallel_size", int),
    "pipeline-model-parallel-size": ("parallel.pipeline_model_parallel_size", int),
    "virtual-pipeline-model-parallel-size": ("parallel.virtual_pipeline_model_parallel_size", int),
    # Megatron-LM d98e8a64 arguments.py line 3116 (validate_args: the virtual stages per rank)
    "num-virtual-stages-per-pipeline-rank": ("parallel.virtual_pipeline_model_parallel_size",
                                             int),
    "context-parallel-size": ("parallel.context_parallel_size", int),
    "expert-model-parallel-size": ("parallel.expert_model_parallel_size", int),
    "expert-tensor-parallel-size": ("parallel.expert_tensor_parallel_size", int),
    "decoder-first-pipeline-num-layers": ("parallel.num_layers_in_first_pipeline_stage", int),
    "decoder-last-pipeline-num-layers": ("parallel.num_layers_in_last_pipeline_stage", int),
    # Megatron-LM d98e8a64 arguments.py line 3103 (workloads/decoder/pp_layout.py)
    "pipeline-model-parallel-layout": ("parallel.pipeline_model_parallel_layout", str),
    "micro-batch-size": ("train.micro_batch_size", int),
    "global-batch-size": ("train.global_batch_size", int),
    "seq-length": ("train.seq_length", int),
    "num-layers": ("model.num_hidden_layers", int),
    # Megatron-LM 9c1a5351 arguments.py line 1386 (d98e8a64: transformer_config.py line 68);
    # a model with MTP layers is refused (their ops are not modelled: decoder/split.py)
    "mtp-num-layers": ("model.mtp_num_layers", int),
    "hidden-size": ("model.hidden_size", int),
    "num-attention-heads": ("model.num_attention_heads", int),
    "ffn-hidden-size": ("model.intermediate_size", int),
    "max-position-embeddings": ("model.max_position_embeddings", int),
    "num-query-groups": ("model.num_key_value_heads", int),
    "kv-channels": ("model.head_dim", int),
    "num-experts": ("model.num_local_experts", int),
    "moe-router-topk": ("model.num_experts_per_tok", int),
    "moe-ffn-hidden-size": ("model.moe_intermediate_size", int),
    "moe-expert-capacity-factor": ("model.capacity_factor", float),
    "moe-aux-loss-coeff": ("parallel.moe.aux_loss_coeff", float),
    # group-limited routing (Megatron-LM d98e8a64 megatron/core/transformer/moe/README.md lines
    # 289, 533-534: groups, then the top groups per token; docs/moe.md "Group-limited routing")
    "moe-router-num-groups": ("parallel.moe.router_num_groups", int),
    "moe-router-group-topk": ("parallel.moe.router_group_topk", int),
    # auxiliary-loss-free balancing's update rate (Megatron-LM 9c1a5351 arguments.py line 2672;
    # d98e8a64 transformer_config.py line 821): the same kernels at any rate; the derived hot
    # rank holds at the source's 1e-3 only (workloads/decoder/moe_balance.py)
    "moe-router-bias-update-rate": ("parallel.moe.router_bias_update_rate", float),
    "zero-stage": ("parallel.zero_stage", int),                # Megatron-DeepSpeed
}

#: flags Megatron-LM declares with ``nargs='*'``/``'+'`` that set a list field → that field
#: (Megatron-LM 9c1a5351 megatron/training/arguments.py line 1692: --recompute-modules, the
#: modules of selective recomputation; each name is checked by the config's own validation)
LIST_FLAGS: dict[str, str] = {
    "recompute-modules": "train.recompute_modules",
}

#: Megatron-LM flags with ``nargs='+'`` whose list ddlsim reads as one value for every layer
#: (9c1a5351 arguments.py line 2293: --cp-comm-type, one type per layer when several are given)
PER_LAYER_CHOICES = ("cp-comm-type",)

_SW = "system.software"
#: switches (no value) → (field, value)
SWITCHES: dict[str, tuple[str, Any]] = {
    "sequence-parallel": ("parallel.sequence_parallel", True),
    # Megatron's distributed optimizer shards the optimizer states over data parallelism
    "use-distributed-optimizer": ("parallel.zero_stage", 1),
    "overlap-grad-reduce": ("parallel.overlap_grad_reduce", True),
    "overlap-param-gather": ("parallel.overlap_param_gather", True),
    "overlap-p2p-communication": ("parallel.overlap_p2p_comm", True),
    # TE userbuffers, all three methods (docs/overlap.md: Megatron's --tp-comm-overlap default)
    "tp-comm-overlap": ("parallel.tp_comm_overlap", "pipelined"),
    "account-for-embedding-in-pipeline-split":
        ("parallel.account_for_embedding_in_pipeline_split", True),
    "account-for-loss-in-pipeline-split": ("parallel.account_for_loss_in_pipeline_split", True),
    "bf16": ("train.dtype", "bf16"),
    "fp16": ("train.dtype", "fp16"),
    "recompute-activations": ("train.recompute", "selective"),
    "moe-grouped-gemm": ("parallel.moe.grouped_gemm", True),
    "moe-permute-fusion": ("parallel.moe.permute_fusion", True),
    "moe-shared-expert-overlap": ("parallel.moe.shared_expert_overlap", True),
    "moe-pad-expert-input-to-capacity": ("parallel.moe.pad_expert_input_to_capacity", True),
    "moe-router-force-load-balancing": ("parallel.moe.router_force_load_balancing", True),
    "moe-router-fusion": ("parallel.moe.router_fusion", True),
    # Megatron-LM 9c1a5351 arguments.py line 2668 (d98e8a64: transformer_config.py line 816)
    "moe-router-enable-expert-bias": ("parallel.moe.router_enable_expert_bias", True),
    # Megatron-LM d7288711 megatron/core/transformer/moe/README.md lines 557-558 (the combined
    # 1F1B, workloads/decoder/combined.py)
    "overlap-moe-expert-parallel-comm": ("parallel.moe.overlap_expert_parallel_comm", True),
    "delay-wgrad-compute": ("parallel.moe.delay_wgrad_compute", True),
    # Megatron-LM 9c1a5351 arguments.py line 2692 (deprecated at d7288711 for the backend flag)
    "moe-enable-deepep": ("parallel.moe.flex_dispatcher_backend", "deepep"),
    "checkpoint-activations": ("train.recompute", "full"),      # Megatron-LM 2021
    "no-bias-gelu-fusion": (f"{_SW}.kernels.fused_bias_gelu", False),
    "no-bias-swiglu-fusion": (f"{_SW}.kernels.fused_bias_gelu", False),
    "no-bias-dropout-fusion": (f"{_SW}.kernels.fused_bias_dropout_add", False),
    "no-gradient-accumulation-fusion": (f"{_SW}.kernels.gradient_accumulation_fusion", False),
    "apply-rope-fusion": (f"{_SW}.kernels.fused_rope", True),
    "no-rope-fusion": (f"{_SW}.kernels.fused_rope", False),
    "cross-entropy-loss-fusion": (f"{_SW}.kernels.fused_cross_entropy", True),
    # Megatron-LM core_r0.8.0 megatron/training/arguments.py line 1576: --no-create-attention-mask-in-
    # dataloader; without it the dataset's s x s mask is copied and broadcast each micro-batch
    # (workloads/decoder/batch_input.py)
    "no-create-attention-mask-in-dataloader": (f"{_SW}.kernels.batch_attention_mask", "none"),
    "accumulate-allreduce-grads-in-fp32": (f"{_SW}.kernels.grad_reduce_dtype", "fp32"),
    # Megatron-LM d7288711 arguments.py line 1733: the TE linears' weights kept in FP8 and
    # gathered in FP8 (workloads/decoder/param_gather.py checks Megatron's rules, lines 924-926)
    "fp8-param-gather": (f"{_SW}.kernels.fp8_param_gather", True),
    "grad-reduce-in-bf16": (f"{_SW}.kernels.grad_reduce_dtype", "param"),
    "no-async-tensor-model-parallel-allreduce": (f"{_SW}.overlap.tp_async_backward", False),
    "untie-embeddings-and-output-weights": ("model.tie_word_embeddings", False),
    # d98e8a64 transformer_config.qk_layernorm: a norm of each query and key head (Qwen3's)
    "qk-layernorm": ("model.qk_norm", True),
    "deepspeed": ("system.software.stack", "deepspeed"),       # Megatron-DeepSpeed
}

#: flags whose value picks fields: flag → value → [(field, value)]
CHOICES: dict[str, dict[str, list[tuple[str, Any]]]] = {
    "recompute-granularity": {"full": [("train.recompute", "full")],
                              "selective": [("train.recompute", "selective")]},
    # 2021: local = all-reduce after the backward; torch = PyTorch DDP's overlapped buckets
    "DDP-impl": {"local": [("parallel.overlap_grad_reduce", False)],
                 "torch": [("parallel.overlap_grad_reduce", True)]},
    "cp-comm-type": {"p2p": [("parallel.cp_comm_type", "p2p")],
                     "all_gather": [("parallel.cp_comm_type", "all_gather")]},
    "attention-backend": {"flash": [(f"{_SW}.kernels.attention", "flash2")],
                          "fused": [(f"{_SW}.kernels.attention", "cudnn")],
                          "unfused": [(f"{_SW}.kernels.attention", "unfused")],
                          "local": [(f"{_SW}.kernels.attention", "fused_softmax")],
                          "auto": []},
    "optimizer": {"adam": [("train.optimizer", "adam")], "sgd": [("train.optimizer", "sgd")]},
    "recompute-method": {"uniform": []},
    "transformer-impl": {"transformer_engine": []},
    # megatron/core/fp8_utils.py: delayed -> TE DelayedScaling, tensorwise -> TE
    # Float8CurrentScaling (simulator/kernels/fp8_current.py); the flag is Megatron-LM of 2025
    # (9c1a5351 arguments.py; 900f1b76 has --fp8-format and DelayedScaling's knobs only)
    "fp8-recipe": {"delayed": [(f"{_SW}.kernels.fp8_recipe", "te_delayed"),
                               (f"{_SW}.stack", "megatron-core-2025")],
                   "tensorwise": [(f"{_SW}.kernels.fp8_recipe", "te_current"),
                                  (f"{_SW}.stack", "megatron-core-2025")]},
    "moe-token-dispatcher-type": {d: [("parallel.moe.token_dispatcher_type", d)]
                                  for d in ("alltoall", "allgather", "flex")},
    "moe-flex-dispatcher-backend": {b: [("parallel.moe.flex_dispatcher_backend", b)]
                                    for b in ("deepep", "hybridep")},
    "moe-router-load-balancing-type": {t: [("parallel.moe.router_load_balancing_type", t)]
                                       for t in ("aux_loss", "seq_aux_loss", "sinkhorn",
                                                 "none")},
    # Megatron-LM 1e057005 arguments.py lines 2637-2638, choices fp32 and fp64: fp64 is refused
    # (config_moe.RouterDtype; workloads/decoder/moe_router.py router_gemm)
    "moe-router-dtype": {"fp32": [("parallel.moe.router_dtype", "fp32")]},
    # Megatron-LM 9c1a5351 arguments.py line 2653 (softmax, sigmoid); d98e8a64
    # transformer_config.py line 808 adds sqrtsoftplus
    "moe-router-score-function": {f: [("parallel.moe.router_score_function", f)]
                                  for f in ("softmax", "sigmoid", "sqrtsoftplus")},
    "rotary-percent": {"1.0": [], "1": []},
    # Megatron-LM d7288711 model_parallel_config.py line 238: Literal['native', 'te'], read
    # under --cross-entropy-loss-fusion only (language_module.py lines 141-167;
    # simulator/kernels/step_passes.py)
    "cross-entropy-fusion-impl": {i: [(f"{_SW}.kernels.cross_entropy_fusion_impl", i)]
                                  for i in ("native", "te")},
}

#: what a choice that sets no field means
CHOICE_NOTES = {
    "attention-backend auto": "TransformerEngine picks the kernel: the stack's attention "
                              "default (system.software.kernels.attention)",
    "recompute-method uniform": "every layer recomputed (in groups of --recompute-num-layers), "
                                "as train.recompute full models it",
    "transformer-impl transformer_engine": "TransformerEngine layers, as the stack's kernels "
                                           "describe them",
    "rotary-percent 1.0": "every head dimension rotated, as ddlsim models RoPE",
    "rotary-percent 1": "every head dimension rotated, as ddlsim models RoPE",
}

#: flags read to build the model section (architecture, vocabulary)
MODEL_FLAGS = ("normalization", "position-embedding-type", "swiglu", "group-query-attention",
               "disable-bias-linear", "tokenizer-type", "vocab-size",
               "make-vocab-size-divisible-by", "num-layers-per-virtual-pipeline-stage",
               "attention-dropout", "hidden-dropout", "recompute-num-layers", "fp8-format",
               # Megatron-DeepSpeed 4efb479d arguments.py lines 623, 633; d98e8a64 line 2437
               "num-key-value-heads", "use-rotary-position-embeddings", "no-position-embedding")

#: flags that cannot change the time of one iteration, with why
NO_EFFECT: dict[str, str] = {
    # Megatron-LM 900f1b76: args.use_flash_attn is read by megatron/legacy/model only
    "use-flash-attn": "read by Megatron's legacy model only (Megatron-LM 900f1b76 "
                      "megatron/legacy/model/transformer.py line 523); a Megatron-Core model "
                      "runs TransformerEngine's attention, which picks its kernel itself "
                      "(system.software.kernels.attention)",
    **dict.fromkeys(("data-path", "split", "vocab-file", "merge-file", "tokenizer-model",
                     "data-cache-path", "mock-data", "data-impl", "dataloader-type",
                     "num-workers", "train-data-path", "valid-data-path", "test-data-path"),
                    "data input"),
    **dict.fromkeys(("save", "load", "save-interval", "no-load-optim", "no-load-rng",
                     "no-save-optim", "no-save-rng", "finetune", "use-checkpoint-args",
                     "ckpt-format", "async-save", "pretrained-checkpoint",
                     "dist-ckpt-strictness"), "checkpointing, not part of an iteration"),
    **dict.fromkeys(("log-interval", "tensorboard-dir", "tensorboard-log-interval",
                     "log-throughput", "log-timers-to-tensorboard", "log-params-norm",
                     "log-num-zeros-in-grad", "log-validation-ppl-to-tensorboard",
                     "log-memory-to-tensorboard", "timing-log-level", "wandb-project",
                     "wandb-exp-name", "wandb-save-dir", "eval-interval", "eval-iters",
                     "exit-interval", "exit-duration-in-mins", "exit-signal-handler"),
                    "logging, evaluation or exit, outside the training iteration"),
    **dict.fromkeys(("lr", "min-lr", "lr-decay-style", "lr-decay-iters", "lr-decay-samples",
                     "lr-warmup-fraction", "lr-warmup-iters", "lr-warmup-samples",
                     "weight-decay", "adam-beta1", "adam-beta2", "adam-eps", "init-method-std",
                     "seed", "train-iters", "train-samples", "rotary-base", "norm-epsilon",
                     "layernorm-epsilon", "loss-scale", "initial-loss-scale", "min-loss-scale",
                     "loss-scale-window", "hysteresis", "distributed-backend",
                     "use-mcore-models", "eod-mask-loss", "reset-position-ids",
                     "reset-attention-mask",
                     "attention-softmax-in-fp32", "fp8-amax-history-len",
                     "use-cpu-initialization", "calculate-per-token-loss",
                     "moe-z-loss-coeff",
                     "fp8-amax-compute-algo", "distributed-timeout-minutes"),
                    "a value of the optimisation or of a kernel, not of its cost"),
    # d98e8a64 transformer_config.py line 799; moe_utils.py lines 900-912: softmax before
    # top-k (over the scores) instead of after it (over the k chosen): the same two kernels,
    # counted over the T x E scores either way (workloads/decoder/moe_router.py)
    "moe-router-pre-softmax": "softmax before the top-k instead of after it: the same "
                              "kernels, counted over the scores either way",
    **MORE_NO_EFFECT,
}

#: accepted, with what ddlsim leaves out
NOT_MODELLED: dict[str, str] = {
    # d98e8a64 transformer_config.py line 804; moe_utils.py lines 933-934
    "moe-router-topk-scaling-factor": "one element-wise product of each token's k routing "
                                      "weights in the router's forward (a launch-bound "
                                      "kernel per MoE layer), not counted",
    "moe-deepep-num-sms": "the SMs DeepEP's kernels take: ddlsim times them at the rates of "
                          "DeepEP's published table (24 SMs) and leaves the compute's SMs whole",
    "moe-hybridep-num-sms": "the SMs HybridEP's kernels take: ddlsim times them at the rates "
                            "of HybridEP's published table (16 SMs) and leaves the compute's "
                            "SMs whole",
    "clip-grad": "the gradient norm (one pass over the gradients and a scalar all-reduce)",
    "rampup-batch-size": "the smaller batches of the first iterations; ddlsim predicts a "
                         "steady iteration at --global-batch-size",
    # d98e8a64 config/training_config.py line 32: "THRESHOLD:BS THRESHOLD:BS …"
    "step-batch-size-schedule": "the smaller batches of the schedule's first steps; ddlsim "
                                "predicts a steady iteration at the schedule's last batch",
    "ddp-bucket-size": "the gradient bucket size in elements (ddlsim's "
                       "parallel.grad_bucket_size, in bytes, keeps its default)",
    "manual-gc": "the host's garbage-collection pauses, with or without it",
    "manual-gc-interval": "the host's garbage-collection pauses",
    "empty-unused-memory-level": "the allocator's cache flushes",
    "deepspeed_config": "the DeepSpeed config's settings, which count only when the file is "
                        "imported too (ddlsim import SCRIPT ds_config.json)",
    "deepspeed-config": "the DeepSpeed config's settings, which count only when the file is "
                        "imported too (ddlsim import SCRIPT ds_config.json)",
    **MORE_NOT_MODELLED,
}

MEGATRON_FLAGS = (*VALUE_FLAGS, *LIST_FLAGS, *SWITCHES, *CHOICES, *MODEL_FLAGS, *NO_EFFECT,
                  *NOT_MODELLED, *FSDP_FLAGS, "no-masked-softmax-fusion")


def megatron_flag_names() -> list[str]:
    """Every Megatron-LM flag the importer reads, as ``--name``."""
    return [f"--{f}" for f in MEGATRON_FLAGS]


def _groups(words: list[str]) -> list[tuple[str, list[str]]]:
    """``[--flag, v, v, --flag2, …]`` as ``(flag, values)`` (``--flag=v`` too)."""
    out: list[tuple[str, list[str]]] = []
    for w in words:
        if w.startswith("--") and len(w) > 2 and not w[2].isdigit():
            name, eq, value = w[2:].partition("=")
            out.append((name, [value] if eq else []))
        elif out:
            out[-1][1].append(w)
        else:
            out.append(("", [w]))
    return out


def read_megatron(text: str, where: str) -> Draft:
    """The ddlsim fields a Megatron-LM command line or launch script sets.

    Parameters
    ----------
    text : str
        A ``pretrain_gpt.py`` launch script, its command line, or its arguments alone.
    where : str
        The source's name in notes and messages (its path).

    Returns
    -------
    Draft
        The fields (dotted paths, SI units as the run config takes them) and the fate of
        every argument; refused arguments are in ``Draft.refused``, not raised here.
    """
    variants = read_commands(text, where)
    drafts = [read_megatron_command(v.command, where) for v in variants]
    first = drafts[0]
    for variant, draft in zip(variants[1:], drafts[1:]):
        changed = sorted(k for k in first.fields.keys() | draft.fields.keys()
                         if first.fields.get(k, "unset") != draft.fields.get(k, "unset"))
        if changed or sorted(draft.refused) != sorted(first.refused):
            what = ", ".join(f"{k} ({first.fields.get(k, 'unset')!r} or "
                             f"{draft.fields.get(k, 'unset')!r})" for k in changed[:4])
            first.refuse("if " + " and ".join(f"{c} is true" for c, t in variant.assumed if t),
                         "only running the script decides this condition (an environment "
                         f"variable, $1 or a file), and it changes {what or 'what is refused'}"
                         "; set what it tests in the script, or give the command line it runs")
            return first
    for cond in dict.fromkeys(c for v in variants for c, _ in v.assumed):
        first.note(f"if {cond}", "either way the same fields (only running the script decides "
                                 "it; the way where it is false is written)")
    return first


def read_megatron_command(cmd, where: str, name: str | None = None) -> Draft:
    """The draft of one command (one way through a script): its launcher, flags and model;
    ``name`` names the model (default: the file's name)."""
    draft = Draft(where)
    own = where.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0] or "megatron"
    draft.set("model.name", name or own,
              "the model's name: " + ("the launcher's MODEL" if name else "the file's"))
    _launcher(draft, cmd.launcher)
    model: dict[str, list[str]] = {}
    fsdp = []
    for flag, values in _groups(cmd.args):
        if flag in FSDP_FLAGS:      # read together, after the rest (.megatron_fsdp)
            fsdp.append((flag, values))
        else:
            _one(draft, flag, values, model)
    megatron_fsdp_flags(draft, fsdp)
    from .megatron_model import model_fields
    model_fields(draft, model, cmd.script)
    return draft


def _launcher(draft: Draft, words: list[str]) -> None:
    for flag, values in _groups(words):
        arg = f"--{flag} {' '.join(values)}".strip()
        if not flag:
            draft.note(" ".join(values), "the launcher")
        elif flag in LAUNCHER and LAUNCHER[flag] is None:
            draft.note(arg, "no effect: the launcher's rendezvous")
        elif flag in LAUNCHER:
            _value(draft, arg, LAUNCHER[flag], values, int)
        else:
            draft.refuse(arg, "a launcher flag ddlsim does not read; it reads --nproc_per_node "
                              "and --nnodes, and knows the rendezvous flags")


def _value(draft: Draft, arg: str, path: str, values: list[str], kind: type) -> None:
    if len(values) != 1:
        draft.refuse(arg, f"expects one value, got {len(values)}")
    elif is_unset(values[0]):
        draft.refuse(arg, f"its value {values[0]} is a variable the script does not set; "
                          "set it in the script, or give the field with --set")
    else:
        try:
            draft.set(path, kind(values[0]), arg)
        except ValueError:
            draft.refuse(arg, f"expects {'a whole number' if kind is int else 'a number'}, "
                              f"got {values[0]!r}")


def _list(draft: Draft, arg: str, path: str, values: list[str]) -> None:
    """Set ``path`` to the list ``values`` (a flag with ``nargs``); the names are checked
    when the imported config is validated, as ``predict`` checks them."""
    unset = [v for v in values if is_unset(v)]
    if not values:
        draft.refuse(arg, "expects one value or more, got none")
    elif unset:
        draft.refuse(arg, f"its value {unset[0]} is a variable the script does not set; "
                          "set it in the script, or give the field with --set")
    else:
        draft.set(path, list(values), arg)


def _one(draft: Draft, flag: str, values: list[str], model: dict[str, list[str]]) -> None:
    arg = f"--{flag} {' '.join(values)}".strip()
    if flag in VALUE_FLAGS:
        path, kind = VALUE_FLAGS[flag]
        _value(draft, arg, path, values, kind)
    elif flag in LIST_FLAGS:
        _list(draft, arg, LIST_FLAGS[flag], values)
    elif flag in SWITCHES:
        if values:
            draft.refuse(arg, f"--{flag} takes no value")
        else:
            draft.set(*SWITCHES[flag], arg)
    elif flag in CHOICES:
        picked = CHOICES[flag].get(values[0] if len(values) == 1 else " ".join(values))
        if picked is None:
            per_layer = " (one for every layer)" if flag in PER_LAYER_CHOICES else ""
            draft.refuse(arg, f"ddlsim models --{flag} {' or '.join(CHOICES[flag])}"
                              f"{per_layer} only")
        for path, value in picked or ():
            draft.set(path, value, arg)
        if picked == []:
            draft.note(arg, CHOICE_NOTES[arg.removeprefix("--")])
    elif flag in MODEL_FLAGS:
        model[flag] = values
    elif flag in NO_EFFECT:
        draft.note(arg, f"no effect on one iteration: {NO_EFFECT[flag]}")
    elif flag == "no-masked-softmax-fusion" and not values:    # decided by the stack
        draft.pending["no_masked_softmax_fusion"] = arg
    elif flag == "step-batch-size-schedule":
        batch_schedule(draft, arg, values, NOT_MODELLED[flag])
    elif flag in KNOWN_REFUSED:
        draft.refuse(arg, KNOWN_REFUSED[flag])
    elif flag in NOT_MODELLED:
        draft.unmodelled_arg(arg, NOT_MODELLED[flag])
    else:
        from ..errors import did_you_mean
        draft.refuse(arg or " ".join(values), "not a Megatron-LM flag ddlsim reads"
                     + did_you_mean(flag, MEGATRON_FLAGS) if flag else
                     "a word that belongs to no --flag")

