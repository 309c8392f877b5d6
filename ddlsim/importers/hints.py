"""What another framework's name means in ddlsim, for "unknown key" messages.

Built from the importers' own tables (:mod:`.megatron`, :mod:`.deepspeed`,
:mod:`.torchtitan`), so a name the importer maps is explained the same way here.
"""

from __future__ import annotations

from functools import cache

__all__ = ["foreign_hint", "foreign_group"]

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
    from .torchtitan import NO_EFFECT_SECTIONS

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
    return out


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
