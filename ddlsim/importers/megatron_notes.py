"""Flags of the launch scripts Megatron-LM and Megatron-DeepSpeed ship: those that cannot change
the time of one iteration, and those that do in a way ddlsim does not model (refused by name,
with why), each with where the flag is defined; the launchers' flags (torchrun's, deepspeed's);
and the step batch-size schedule.

Found by importing the real scripts (tests/importers/data/real/SOURCES.md): Megatron-LM
d98e8a64's ``examples/llama/train_llama3_8b_h100_fp8.sh`` and
``examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh``, Megatron-DeepSpeed 4efb479d's
``examples_deepspeed/pretrain_llama2_distributed.sh``.
"""

from __future__ import annotations

from .common import Draft

__all__ = ["MORE_NO_EFFECT", "MORE_NOT_MODELLED", "KNOWN_REFUSED", "LAUNCHER", "batch_schedule",
           "masked_softmax"]

#: flag → why it changes no iteration's time
MORE_NO_EFFECT: dict[str, str] = {
    # d98e8a64 arguments.py line 2994: learning rates of the input and output layers
    **dict.fromkeys(("decoupled-lr", "decoupled-min-lr"),
                    "a learning rate (of the embedding and output layers), not a cost"),
    # d98e8a64 megatron/core/transformer/transformer_config.py line 206
    # (layernorm_zero_centered_gamma): the norm's weight read as 1 + gamma in the same kernel
    "apply-layernorm-1p": "the norm's weight stored as gamma - 1 (TransformerEngine's "
                          "zero_centered_gamma): the same norm kernel",
    # d98e8a64 models/dist_utils.py line 70: parameters materialised after sharding
    "init-model-with-meta-device": "how the model is initialised, before the first "
                                   "iteration",
    # d98e8a64 arguments.py line 3299
    "no-mmap-bin-files": "data input (how the dataset's .bin files are read)",
    # d98e8a64 config/training_config.py line 724
    "tiktoken-pattern": "data input (the tokenizer's split pattern)",
    # d98e8a64 config/common_config.py line 35; training.py line 4498: the profiler runs on
    # the steps named, not on a steady iteration
    **dict.fromkeys(("profile", "profile-step-start", "profile-step-end", "profile-ranks",
                     "use-pytorch-profiler"),
                    "profiling of the steps it names, not a steady iteration"),
    # d98e8a64 config/training_config.py line 351
    "logging-level": "logging, outside the training iteration",
    # Megatron-DeepSpeed 4efb479d megatron/arguments.py line 1129: 1/layer-number folded
    # into the softmax's scale, the same kernel
    "no-query-key-layer-scaling": "a factor of the attention softmax's scale, the same "
                                  "kernel",
    # d98e8a64 arguments.py line 3643: a gate; each experimental feature has its own flag,
    # read (or refused) by its name
    "enable-experimental": "a gate for experimental features, each of which has its own "
                           "flag",
    # d98e8a64 arguments.py line 2422: positions divided by the factor, the same RoPE kernel
    "rotary-seq-len-interpolation-factor": "a value of the rotary positions, the same RoPE "
                                           "kernel",
    # d98e8a64 config/training_config.py line 196 (the warm-up's first learning rate)
    "lr-warmup-init": "a learning rate, not a cost",
    # d98e8a64 config/training_config.py line 493; checkpointing.py line 1929
    "auto-detect-ckpt-format": "checkpointing, not part of an iteration",
    # d98e8a64 arguments.py lines 1766-1777 (the parallel save of distributed checkpoints)
    "no-ckpt-fully-parallel-save": "checkpointing, not part of an iteration",
    # d98e8a64 transformer_config.py line 75: the MTP losses' weight in the total loss
    "mtp-loss-scaling-factor": "a loss weight, not a cost",
}

#: flag → what of its effect ddlsim leaves out (accepted, with a warning)
MORE_NOT_MODELLED: dict[str, str] = {
    # d98e8a64 arguments.py line 2872; param_and_grad_buffer.py line 655 takes the norm of
    # each gradient bucket only while the check is on (training.py line 2636); ddlsim's
    # Megatron stacks keep the check (software.yaml ddp.bucket_passes: 3, host.loss)
    "no-check-for-nan-in-loss-and-grad": "turning off the NaN check's norm over each "
                                         "gradient bucket and the loss's isnan: ddlsim's "
                                         "Megatron stacks keep both, a pass over each bucket "
                                         "more than this run",
}

#: d98e8a64 arguments.py line 2016; what it does: the linear weights are TransformerEngine
#: FP8 tensors stored in the DDP parameter buffer (param_and_grad_buffer.py lines 81-89,
#: 1277-1290); after the step the distributed optimizer quantizes each FP32 master shard into
#: that buffer (distrib_optimizer.py lines 2825-2851, quantize_param_shard, with its amax
#: all-reduce over the data-parallel group) and the bucket all-gather moves 1 byte per FP8
#: element. ddlsim's float8 all-gather (kernels.enable_fsdp_float8_all_gather,
#: workloads/decoder/fsdp_float8.py) is torchao's under FSDP2 (ZeRO-3 per-layer gathers, the
#: cast before each gather from the 16-bit shard, tensorwise scaling) and is refused elsewhere;
#: ZeRO-1/2's gather after the step counts the parameters' dtype (decoder/update.py).
_NCCL_BUFFERS = ("NCCL's registered user buffers for Megatron-FSDP's collectives: not "
                 "modelled; ddlsim times NCCL's collectives without them")

#: Megatron-LM flags that change the time in a way ddlsim does not model → why (refused by
#: name; ``--ignore NAME`` imports without one)
KNOWN_REFUSED: dict[str, str] = {
    "use-nccl-ub": _NCCL_BUFFERS,                      # d98e8a64 arguments.py line 3171
    "fsdp-manual-registration": _NCCL_BUFFERS,         # d98e8a64 arguments.py line 3184
    # d98e8a64 arguments.py line 3202; distributed_data_parallel_config.py line 138
    "fsdp-double-buffer": "Megatron-FSDP's two fixed buffers for gathered parameters: not "
                          "modelled; ddlsim's Megatron-FSDP allocates each unit's gather",
    "optimizer-cpu-offload": "the optimizer step on the CPU (d98e8a64 arguments.py line "
                             "2918): not modelled; ddlsim steps the optimizer on the GPU",
    # d98e8a64 transformer_config.py line 1075 (cuda_graph_impl), arguments.py line 2047
    # (--cuda-graph-scope, deprecated for --cuda-graph-modules)
    **dict.fromkeys(("cuda-graph-impl", "cuda-graph-scope", "cuda-graph-modules"),
                    "CUDA graphs replay the captured scopes' kernels without the host "
                    "launching each: not modelled; ddlsim launches every kernel from the host "
                    "(and waits where the dispatcher waits)"),
}


#: launcher (torchrun, torch.distributed.launch/run, deepspeed) flags
LAUNCHER: dict[str, str | None] = {
    "nproc_per_node": "system.devices_per_node", "nproc-per-node": "system.devices_per_node",
    "nnodes": "system.nodes",
    "num_gpus": "system.devices_per_node", "num_nodes": "system.nodes",   # the deepspeed launcher
    **dict.fromkeys((
        "hostfile", "include", "exclude", "launcher", "no_local_rank", "node_rank",
        "node-rank", "master_addr", "master-addr", "master_port", "master-port", "rdzv_id",
        "rdzv-id", "rdzv_backend", "rdzv-backend", "rdzv_endpoint", "rdzv-endpoint",
        "max_restarts", "max-restarts", "standalone"))}


def batch_schedule(draft: Draft, arg: str, values: list[str], what: str) -> None:
    """``--step-batch-size-schedule "0:16 … 12B:1536"`` (d98e8a64 config/training_config.py
    line 32): the steady batch is the last step's, and must agree with
    ``--global-batch-size`` when both are given; the smaller first batches (``what``) are not
    modelled."""
    last = " ".join(values).split()[-1:] or [""]
    size = last[0].rpartition(":")[2]
    if not size.isdigit() or int(size) == 0:
        draft.refuse(arg, "expects THRESHOLD:BATCH pairs ending in a whole batch size "
                          "(Megatron-LM's format, e.g. '0:16 2.4B:320 12B:1536')")
        return
    draft.set("train.global_batch_size", int(size), arg + " (the last step's batch)")
    draft.unmodelled_arg(arg, what)


#: stacks whose attention is Megatron's own scale-mask-softmax, which the flag unfuses
_OWN_SOFTMAX = ("megatron-lm-2021", "deepspeed")


def masked_softmax(config: dict, draft: Draft) -> None:
    """``--no-masked-softmax-fusion``, decided once the stack is known. It turns off the
    fused scale-mask-softmax of Megatron's own attention (6985e58 megatron/arguments.py lines
    441-445; Megatron-DeepSpeed's legacy model alike): ``kernels.attention: unfused`` on
    those stacks. Megatron-Core reads it only in its local attention (d98e8a64
    megatron/core/transformer/dot_product_attention.py line 104, ``--transformer-impl
    local``); its default TransformerEngine attention ignores it."""
    arg = draft.pending["no_masked_softmax_fusion"]
    system = config.setdefault("system", {})
    sw = system.get("software")
    from ..software import DEFAULT_STACK
    stack = sw if isinstance(sw, str) else (sw or {}).get("stack", DEFAULT_STACK)
    if stack in _OWN_SOFTMAX:
        if not isinstance(sw, dict):
            sw = system["software"] = {"stack": stack}
        sw.setdefault("kernels", {}).setdefault("attention", "unfused")
        draft.note(arg, f"system.software.kernels.attention: 'unfused' (the {stack} stack's "
                        "attention is Megatron's own fused scale-mask-softmax)")
    else:
        draft.note(arg, f"no effect on the {stack} stack: TransformerEngine's attention "
                        "ignores it (Megatron-Core reads it in --transformer-impl local's "
                        "attention only, dot_product_attention.py line 104)")
