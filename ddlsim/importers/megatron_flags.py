"""The Megatron-LM flags the importer reads (:mod:`.megatron`), by their fate: one value or a
list setting a ddlsim field, a switch, a choice among values, a model flag read together with
the others (:mod:`.megatron_model`), no effect on one iteration, or not modelled; the flag
names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (and, for the 2021
flags ``--checkpoint-activations`` and ``--DDP-impl``, ``megatron/arguments.py`` of 6985e58).
"""

from __future__ import annotations

from typing import Any

from .megatron_fsdp import FSDP_FLAGS
from .megatron_moe_model import MOE_MODEL_FLAGS
from .megatron_notes import MORE_NO_EFFECT, MORE_NOT_MODELLED

__all__ = ["VALUE_FLAGS", "LIST_FLAGS", "PER_LAYER_CHOICES", "SWITCHES", "CHOICES",
           "CHOICE_NOTES", "MODEL_FLAGS", "NO_EFFECT", "NOT_MODELLED", "MEGATRON_FLAGS",
           "megatron_flag_names"]

#: flags with one value → the ddlsim field it sets (the value read as its type)
VALUE_FLAGS: dict[str, tuple[str, type]] = {
    "tensor-model-parallel-size": ("parallel.tensor_model_parallel_size", int),
    "pipeline-model-parallel-size": ("parallel.pipeline_model_parallel_size", int),
    "virtual-pipeline-model-parallel-size": ("parallel.virtual_pipeline_model_parallel_size", int),
    # Megatron-LM d98e8a64 arguments.py line 3116 (validate_args: the virtual stages per rank)
    "num-virtual-stages-per-pipeline-rank": ("parallel.virtual_pipeline_model_parallel_size",
                                             int),
    # Megatron-LM d98e8a64 megatron/core/model_parallel_config.py lines 431-436
    "microbatch-group-size-per-virtual-pipeline-stage": (
        "parallel.microbatch_group_size_per_vp_stage", int),
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
    # the SMs the flex dispatcher's kernels hold: Megatron-LM d98e8a64 transformer_config.py
    # line 964 (moe_flex_dispatcher_num_sms), the deprecated per-backend knobs (d7288711 lines
    # 803, 806; d98e8a64 lines 969-975, routed to it in __post_init__, lines 1792-1811: two
    # different deprecated values are an error there, and two arguments setting one field to
    # different values are refused here)
    "moe-flex-dispatcher-num-sms": ("parallel.moe.flex_dispatcher_num_sms", int),
    "moe-deepep-num-sms": ("parallel.moe.flex_dispatcher_num_sms", int),
    "moe-hybridep-num-sms": ("parallel.moe.flex_dispatcher_num_sms", int),
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
    # d98e8a64 transformer_config.py line 218 (add_qkv_bias): a bias on the QKV projection
    # only, Qwen2's (the llama family's qkv_bias)
    "add-qkv-bias": ("model.qkv_bias", True),
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
}

#: flags read to build the model section (architecture, vocabulary)
MODEL_FLAGS = ("normalization", "position-embedding-type", "swiglu", "group-query-attention",
               "disable-bias-linear", "tokenizer-type", "vocab-size",
               "make-vocab-size-divisible-by", "num-layers-per-virtual-pipeline-stage",
               "attention-dropout", "hidden-dropout", "recompute-num-layers", "fp8-format",
               # Megatron-DeepSpeed 4efb479d arguments.py lines 623, 633; d98e8a64 line 2437
               "num-key-value-heads", "use-rotary-position-embeddings", "no-position-embedding",
               # Megatron-LM 900f1b76 arguments.py: --squared-relu (lines 620-622),
               # --rotary-percent (float, default 1.0)
               "squared-relu", "rotary-percent",
               *MOE_MODEL_FLAGS)

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
                     "fp8-amax-compute-algo", "distributed-timeout-minutes",
                     # YaRN's RoPE frequencies and attention scale of MLA (d98e8a64
                     # arguments.py lines 3558-3562): values in the same kernels
                     "rotary-scaling-factor", "mscale", "mscale-all-dim"),
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
