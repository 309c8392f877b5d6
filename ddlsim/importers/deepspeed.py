"""A DeepSpeed ``ds_config.json`` → ddlsim fields.

Key names and defaults are DeepSpeed's configuration reference
(https://www.deepspeed.ai/docs/config-json/, ``deepspeed/runtime/config.py`` and
``deepspeed/runtime/zero/config.py``). A ds_config describes the runtime, not the model or
the system: combine it with a Hugging Face model folder or ``--set model=…``, and give the
sequence length with ``--set train.seq_length=N``. It implies the ``deepspeed`` stack.
"""

from __future__ import annotations

import math

from typing import Any

from .common import Draft

__all__ = ["read_deepspeed", "deepspeed_key_names", "TOP", "ZERO"]

_SW = "system.software"

#: top-level keys: a field, a function of the value, or why it has no effect
TOP: dict[str, Any] = {
    "train_batch_size": "train.global_batch_size",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "check",
    "zero_optimization": "section",
    "bf16": "section",
    "fp16": "section",
    "optimizer": "section",
    "activation_checkpointing": "section",
    "communication_data_type": "section",
    "gradient_clipping": "not modelled: the gradient norm (one pass over the gradients and "
                         "a scalar all-reduce)",
    "prescale_gradients": "not modelled: a scaling pass over the gradients",
    "gradient_predivide_factor": "not modelled: a scaling pass over the gradients",
    **dict.fromkeys(("scheduler", "steps_per_print", "wall_clock_breakdown", "dump_state",
                     "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler",
                     "comms_logger", "zero_allow_untested_optimizer", "seed",
                     "memory_breakdown", "checkpoint", "elasticity", "data_efficiency",
                     "zero_force_ds_cpu_optimizer", "timers"),
                    "no effect on one iteration: schedule, logging, profiling or checkpoints"),
}

#: DeepSpeed keys that change the time in a way ddlsim does not model → why
REFUSED = {
    # deepspeed/runtime/config.py get_data_types: the dtype gradients accumulate in
    "data_types": "the gradients' accumulation dtype (data_types.grad_accum_dtype): not "
                  "modelled apart from system.software.kernels.grad_reduce_dtype",
    # DeepSpeed AutoTP training (tensor_parallel.autotp_size, deepspeed/runtime/config.py)
    "tensor_parallel": "DeepSpeed's AutoTP: not modelled; give parallel."
                       "tensor_model_parallel_size with --set only for Megatron-style TP",
}

#: zero_optimization keys
ZERO: dict[str, Any] = {
    "stage": "parallel.zero_stage",
    "overlap_comm": "parallel.overlap_grad_reduce",
    "stage3_param_persistence_threshold": f"{_SW}.overlap.zero3_persistence_threshold",
    "stage3_max_reuse_distance": f"{_SW}.overlap.zero3_max_reuse_distance",
    **dict.fromkeys(("contiguous_gradients", "allgather_partitions", "reduce_scatter",
                     "round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint",
                     "stage3_gather_16bit_weights_on_model_save",
                     "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters",
                     "memory_efficient_linear", "sub_group_size", "stage3_max_live_parameters"),
                    "expected"),
    **dict.fromkeys(("reduce_bucket_size", "allgather_bucket_size",
                     "stage3_prefetch_bucket_size"), "bucket"),
    "offload_optimizer": "offload",
    "offload_param": "offload",
}

#: zero_optimization switches whose DeepSpeed default ddlsim models, and that value
_EXPECTED = {"contiguous_gradients": None, "allgather_partitions": True, "reduce_scatter": True,
             "round_robin_gradients": None, "load_from_fp32_weights": None,
             "elastic_checkpoint": None, "stage3_gather_16bit_weights_on_model_save": None,
             "stage3_gather_fp16_weights_on_model_save": None, "ignore_unused_parameters": None,
             "memory_efficient_linear": None, "sub_group_size": None,
             "stage3_max_live_parameters": None}

_OPTIMIZERS = {"adam": "adam", "adamw": "adam", "fusedadam": "adam", "cpuadam": None,
               "onebitadam": None, "lamb": None, "sgd": "sgd"}


def deepspeed_key_names() -> list[str]:
    """Every ds_config key the importer reads (``zero_optimization.stage``, …)."""
    return [*TOP, *(f"zero_optimization.{k}" for k in ZERO),
            "bf16.enabled", "fp16.enabled", "optimizer.type", "optimizer.params",
            "activation_checkpointing.*"]


def read_deepspeed(doc: Any, where: str) -> Draft:
    """The ddlsim fields a DeepSpeed ds_config sets.

    Parameters
    ----------
    doc : object
        The parsed ``ds_config.json``.
    where : str
        The source's name in notes and messages.

    Returns
    -------
    Draft
        The fields, the fate of every key, and the gradient accumulation steps pending the
        data-parallel size (``Draft.pending``).
    """
    draft = Draft(where)
    if not isinstance(doc, dict):
        draft.refuse(where, "a ds_config is a JSON object")
        return draft
    draft.set("system.software.stack", "deepspeed", "a DeepSpeed config: the deepspeed stack")
    for key, value in doc.items():
        rule = TOP.get(key)
        if key in REFUSED:
            draft.refuse(f"{key}: {value}", REFUSED[key])
        elif rule is None:
            from ..errors import did_you_mean
            draft.refuse(key, "not a ds_config key ddlsim reads" + did_you_mean(key, TOP))
        elif rule == "section":
            _SECTIONS[key](draft, value)
        elif rule == "check" and value == "auto":
            draft.note(f"{key}: auto", _AUTO.format("train.global_batch_size (micro-batch × "
                                                    "accumulation × DP)"))
        elif rule == "check":
            draft.pending["gradient_accumulation_steps"] = value
            draft.note(f"{key}: {value}", "checked against global / (micro-batch × DP)")
        elif rule.startswith("not modelled"):
            draft.unmodelled_arg(f"{key}: {value}", rule.removeprefix("not modelled: "))
        elif rule.startswith("no effect"):
            draft.note(key, rule)
        else:
            _count(draft, f"{key}: {value}", rule, value)
    return draft


#: "auto": the value the Hugging Face Trainer fills in from its TrainingArguments
#: (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_process)
_AUTO = ("'auto': the Hugging Face Trainer fills it from its TrainingArguments, which ddlsim "
         "does not read; give {} with --set")


def _count(draft: Draft, arg: str, path: str, value: Any) -> None:
    if value == "auto":
        draft.note(arg, _AUTO.format(f"{path}=N"))
    elif (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value != int(value)):
        draft.refuse(arg, "expects a whole number")
    else:
        draft.set(path, int(value), arg)


def _zero(draft: Draft, section: Any) -> None:
    for key, value in _items(draft, "zero_optimization", section):
        arg, rule = f"zero_optimization.{key}: {value}", ZERO.get(key)
        if rule is None:
            from ..errors import did_you_mean
            draft.refuse(f"zero_optimization.{key}", "not a key ddlsim reads"
                         + did_you_mean(key, ZERO))
        elif rule == "expected":
            want = _EXPECTED[key]
            if want is None or value == want:
                draft.note(arg, "no effect on one iteration's time as ddlsim models it")
            else:
                draft.refuse(arg, f"ddlsim models {key}: {want} only (not modelled yet)")
        elif rule == "bucket":
            draft.unmodelled_arg(arg, "bucket sizes of DeepSpeed's ZeRO collectives (ddlsim "
                                      "gathers and reduces per layer or module)")
        elif rule == "offload":
            device = value.get("device", "none") if isinstance(value, dict) else value
            if device in ("none", None):
                draft.note(arg, "no offload")
            else:
                draft.refuse(arg, "offloading to the host or NVMe is not modelled yet")
        elif path_is_bool(rule):
            if isinstance(value, bool):
                draft.set(rule, value, arg)
            else:
                draft.refuse(arg, "expects true or false")
        else:
            _count(draft, arg, rule, value)
    if draft.fields.get("parallel.zero_stage") != 3:
        _stage3_keys_unread(draft)
    overlap = draft.fields.get("parallel.overlap_grad_reduce")
    if draft.fields.get("parallel.zero_stage") == 3 and overlap is not None:
        del draft.fields["parallel.overlap_grad_reduce"]   # ZeRO-3 has no separate switch
        draft.notes = [n for n in draft.notes
                       if not n[1].startswith("parallel.overlap_grad_reduce")]
        if overlap:
            draft.note("zero_optimization.overlap_comm: True", "ZeRO-3's per-layer "
                       "reduce-scatters overlap the backward, as ddlsim models ZeRO-3")
        else:
            draft.refuse("zero_optimization.overlap_comm: False", "ZeRO-3 with blocking "
                         "reduce-scatters is not modelled yet")


def _stage3_keys_unread(draft: Draft) -> None:
    """Below stage 3 DeepSpeed reads no ``stage3_*`` key (its engine's
    ``_configure_zero_optimizer`` passes them to the stage-3 optimizer only), and ddlsim
    refuses a ``zero3_*`` field on a plan without ZeRO-3: the keys set nothing, noted so."""
    zero3 = f"{_SW}.overlap.zero3_"
    for path in [p for p in draft.fields if p.startswith(zero3)]:
        del draft.fields[path]
    draft.notes = [(arg, "unread: DeepSpeed reads stage3_* keys under stage 3 only")
                   if out.startswith(zero3) else (arg, out) for arg, out in draft.notes]


def path_is_bool(path: str) -> bool:
    """Whether a ZeRO key's field takes true/false."""
    return path == "parallel.overlap_grad_reduce"


def _items(draft: Draft, name: str, section: Any) -> list[tuple[str, Any]]:
    if isinstance(section, dict):
        return list(section.items())
    draft.refuse(f"{name}: {section!r}", "expects a JSON object")
    return []


def _precision(name: str):
    def read(draft: Draft, section: Any) -> None:
        for key, value in _items(draft, name, section):
            arg = f"{name}.{key}: {value}"
            if key == "enabled" and value is True:
                draft.set("train.dtype", name, arg)
            elif key == "enabled" and value is False:
                draft.note(arg, "off")
            elif key == "enabled":
                draft.refuse(arg, "expects true or false ('auto' is the HF Trainer's, filled "
                                  "from its TrainingArguments: import with --ignore "
                                  f"{name}.enabled --set train.dtype=…, since train.dtype has a "
                                  "default that would stand in for it silently)")
            else:
                draft.note(arg, "no effect on one iteration: loss scaling")
    return read


def _optimizer(draft: Draft, section: Any) -> None:
    for key, value in _items(draft, "optimizer", section):
        if key == "type":
            kind = _OPTIMIZERS.get(str(value).lower())
            if kind is None:
                draft.refuse(f"optimizer.type: {value}", "ddlsim models Adam, AdamW and SGD "
                                                          "on the device (not modelled yet)")
            else:
                draft.set("train.optimizer", kind, f"optimizer.type: {value}")
        else:
            draft.note(f"optimizer.{key}", "no effect on one iteration: hyper-parameters")


def _checkpointing(draft: Draft, section: Any) -> None:
    for key, value in _items(draft, "activation_checkpointing", section):
        arg = f"activation_checkpointing.{key}: {value}"
        if key in ("partition_activations", "cpu_checkpointing") and value:
            draft.refuse(arg, "partitioned or host-offloaded checkpoints are not modelled yet")
        else:
            draft.note(arg, "no effect by itself: the model's code decides what it "
                            "recomputes; give train.recompute with --set")


def _communication(draft: Draft, value: Any) -> None:
    kinds = {"fp32": "fp32", "fp16": "param", "bf16": "param"}
    if isinstance(value, str) and value in kinds:
        draft.set(f"{_SW}.kernels.grad_reduce_dtype", kinds[value],
                  f"communication_data_type: {value}")
    else:
        draft.refuse(f"communication_data_type: {value}", "ddlsim models fp32, fp16, bf16")


_SECTIONS = {"zero_optimization": _zero, "bf16": _precision("bf16"), "fp16": _precision("fp16"),
             "optimizer": _optimizer, "activation_checkpointing": _checkpointing,
             "communication_data_type": _communication}
