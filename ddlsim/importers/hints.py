"""What another framework's name means in ddlsim, for "unknown key" messages.

Built from the importers' own tables (:mod:`.megatron`, :mod:`.deepspeed`,
:mod:`.torchtitan`), so a name the importer maps is explained the same way here.
"""

from __future__ import annotations

from functools import cache

__all__ = ["foreign_hint", "foreign_group", "value_hint"]

#: Megatron-LM names whose ddlsim meaning is more than one field
_SPECIAL = {
    "num_layers_per_virtual_pipeline_stage":
        "Megatron-LM's --num-layers-per-virtual-pipeline-stage L is ddlsim's "
        "parallel.virtual_pipeline_model_parallel_size = layers / PP / L, with schedule: "
        "interleaved",
    "use_distributed_optimizer":
        "Megatron-LM's --use-distributed-optimizer is ddlsim's parallel.zero_stage: 1 "
        "(Megatron's distributed optimizer shards optimizer states)",
}

#: Short names users type for a field (``--set parallel.tp=4``), and the field they mean.
_SHORTHAND = {
    "tp": "parallel.tensor_model_parallel_size", "pp": "parallel.pipeline_model_parallel_size",
    "dp": "parallel.data_parallel_size", "cp": "parallel.context_parallel_size",
    "ep": "parallel.expert_model_parallel_size", "etp": "parallel.expert_tensor_parallel_size",
    "vpp": "parallel.virtual_pipeline_model_parallel_size", "sp": "parallel.sequence_parallel",
    "zero": "parallel.zero_stage", "mbs": "train.micro_batch_size",
    "gbs": "train.global_batch_size", "seq_len": "train.seq_length",
    "sequence_length": "train.seq_length", "precision": "train.dtype",
    "gpus_per_node": "system.devices_per_node", "num_gpus_per_node": "system.devices_per_node",
    "num_nics": "system.nics_per_node", "nics": "system.nics_per_node",
}


@cache
def _table() -> dict[str, str]:
    from .deepspeed import TOP
    from .megatron_flags import CHOICES, SWITCHES, VALUE_FLAGS
    from .torchtitan import DEGREE_FIELDS, NO_EFFECT_SECTIONS

    out: dict[str, str] = {}
    for flag, (path, _) in VALUE_FLAGS.items():
        out[flag.replace("-", "_")] = f"Megatron-LM's --{flag} is ddlsim's {path}"
    for flag, (path, value) in SWITCHES.items():
        out[flag.replace("-", "_")] = f"Megatron-LM's --{flag} is ddlsim's {path}: {value}"
    for flag, choices in CHOICES.items():
        paths = sorted({p for pairs in choices.values() for p, _ in pairs})
        if paths:
            out[flag.replace("-", "_")] = (f"Megatron-LM's --{flag} sets ddlsim's "
                                           f"{' or '.join(paths)}")
    out.update(_SPECIAL)
    for short, path in _SHORTHAND.items():
        out.setdefault(short, f"{short!r} is written {path}")
    for key in TOP:
        out.setdefault(key, f"{key!r} is a DeepSpeed ds_config key: convert the file with "
                            "`ddlsim import ds_config.json` (docs/import.md)")
    for section in (*NO_EFFECT_SECTIONS, "training", "parallelism", "activation_checkpoint",
                    "float8", "compile"):
        out.setdefault(section, f"[{section}] is a torchtitan TOML section: convert the file "
                                "with `ddlsim import FILE.toml` (docs/import.md)")
    for key, path in DEGREE_FIELDS.items():
        out.setdefault(key, f"torchtitan's [parallelism] {key} is ddlsim's {path}")
    for key, hint in _CONCEPTS.items():   # a word for a concept: what it is here, first
        deepspeed = " (a DeepSpeed ds_config: convert it with `ddlsim import ds_config.json`)"
        out[key] = hint + (deepspeed if key in TOP else "")
    return out


#: What FSDP, HSDP and a GPU count are in ddlsim's fields (the hints below share them).
_FSDP = ("FSDP (parameters, gradients and optimizer states sharded over the data-parallel "
         "ranks) is parallel.zero_stage: 3 with dp_strategy: ddp; the torchtitan-2024 and "
         "torchtitan-2025 stacks run it as FSDP2 (a unit per transformer block), "
         "fms-fsdp-2024 as FSDP1 (system.software)")
_HSDP = ("HSDP is parallel.zero_stage: 3 with dp_strategy: ddp, sharded within "
         "parallel.data_parallel_size / data_parallel_replicate_size ranks and replicated "
         "data_parallel_replicate_size times (parallel.data_parallel_replicate_size)")
_GPUS = ("ddlsim counts the GPUs as system.nodes × system.devices_per_node (a system preset "
         "sets the devices per node: dgx-h100 has 8, so 64 GPUs is nodes: 8); data "
         "parallelism fills what TP × CP × PP leave")
_GPU = ("the GPU is system.device (a device preset or its fields), or the whole machine is a "
        "system preset (system: dgx-h100, with nodes: N); `ddlsim presets` lists both")
_RECOMPUTE = ("activation checkpointing is train.recompute: none, selective (the attention "
              "core, or the stack's per-op policy) or full (every layer; with "
              "train.recompute_every_n_layers, one layer in n)")
_BATCH = ("train.micro_batch_size is the sequences one rank runs per micro-batch, "
          "train.global_batch_size the sequences per iteration (micro-batches follow from "
          "both and the data-parallel size)")

#: Words users type for a concept ddlsim names otherwise, in any section.
_CONCEPTS = {
    "fsdp": _FSDP, "use_fsdp": _FSDP, "fully_shard": _FSDP, "fsdp_size": _FSDP,
    "hsdp": _HSDP,
    "data_parallel_shard_degree": f"torchtitan's [parallelism] data_parallel_shard_degree is "
                                  f"the FSDP degree: parallel.data_parallel_size, and {_FSDP}",
    "data_parallel_replicate_degree": "torchtitan's [parallelism] "
                                      "data_parallel_replicate_degree is "
                                      "parallel.data_parallel_replicate_size (HSDP's replicas)",
    "gpus": _GPUS, "num_gpus": _GPUS, "n_gpus": _GPUS, "ngpus": _GPUS, "total_gpus": _GPUS,
    "world_size": _GPUS, "num_devices": _GPUS,
    "gpu": _GPU, "gpu_type": _GPU, "accelerator": _GPU,
    "num_nodes": "the node count is system.nodes", "nnodes": "the node count is system.nodes",
    "activation_checkpointing": _RECOMPUTE, "gradient_checkpointing": _RECOMPUTE,
    "activation_checkpoint": _RECOMPUTE,
    "batch_size": _BATCH, "local_batch_size": _BATCH, "train_batch_size": _BATCH,
    "train_micro_batch_size_per_gpu": _BATCH,
}


#: A value users type for one of ddlsim's closed choices in another framework's words:
#: (field, value in lower case) → what it is here.
_VALUES = {
    **{("parallel.dp_strategy", v): _FSDP for v in ("fsdp", "fsdp1", "fsdp2", "zero3",
                                                     "zero-3", "fully_shard")},
    ("parallel.dp_strategy", "hsdp"): _HSDP,
    **{("parallel.dp_strategy", v): "ZeRO is parallel.zero_stage (1: optimizer states, 2: and "
       "gradients, 3: and parameters) with dp_strategy: ddp" for v in (
           "zero", "zero1", "zero-1", "zero2", "zero-2", "deepspeed")},
    **{("train.dtype", v): f"it is written {d!r}" for d, vs in {
        "bf16": ("bfloat16", "bf16-mixed", "bf16_mixed", "amp_bf16"),
        "fp16": ("float16", "half", "fp16-mixed", "16-mixed", "amp", "amp_fp16"),
        "fp32": ("float32", "float", "32", "32-true"),
        "fp8": ("float8", "e4m3", "fp8_e4m3", "float8_e4m3fn", "hybrid"),
    }.items() for v in vs},
    **{("train.recompute", v): "torchtitan's per-op selective checkpointing is recompute: "
       "selective (the stack's selective_recompute names the ops)" for v in (
           "op", "selective_op")},
    **{("train.recompute", v): "a layer in n checkpointed whole is recompute: full with "
       "train.recompute_every_n_layers: n (torchtitan's selective_ac_option = n)" for v in (
           "layer", "selective_layer")},
    ("train.recompute", "true"): "every layer checkpointed is recompute: full (selective: "
                                 "the attention core or the stack's per-op policy)",
    ("train.recompute", "false"): "no checkpointing is recompute: none",
}


def value_hint(field: str, value: object) -> str:
    """What ``value`` of the closed choice ``field`` (``section.key``) means if it is another
    framework's word for one of ddlsim's settings, else ``""``."""
    if not isinstance(value, (str, bool)):
        return ""
    return _VALUES.get((field, str(value).lower()), "")


def foreign_hint(key: object) -> str:
    """What ``key`` means if it is another framework's name (Megatron-LM flag with
    underscores, DeepSpeed key, torchtitan section), else ``""``."""
    return _table().get(str(key), "") if isinstance(key, str) else ""


def foreign_group(key: object) -> tuple[str, str] | None:
    """``(noun, advice)`` when ``key`` is a DeepSpeed key or a torchtitan section (a config
    of another framework given as a ddlsim one), else None."""
    from .deepspeed import TOP
    from .torchtitan import NO_EFFECT_SECTIONS

    if not isinstance(key, str):
        return None
    if key in TOP:
        return ("DeepSpeed ds_config key", "convert the file with `ddlsim import "
                "ds_config.json` (docs/import.md)")
    if key in (*NO_EFFECT_SECTIONS, "training", "parallelism", "activation_checkpoint",
               "float8", "compile"):
        return ("torchtitan TOML section", "convert the file with `ddlsim import FILE.toml` "
                "(docs/import.md)")
    return None
