"""A torchtitan train config (TOML) → ddlsim fields (the 2024 format through
:mod:`.torchtitan2024`, on the ``torchtitan-2024`` stack).

Key names and defaults are torchtitan's ``torchtitan/config/job_config.py`` (``[training]
batch_size`` before its rename to ``local_batch_size``); the ``llama3`` and ``qwen3`` flavors
are the presets of their shapes (:mod:`.torchtitan_flavors`). The run's
stack is ``torchtitan-2025`` (this config format's; ``ddlsim/data/software.yaml``): FSDP (a
shard or context-parallel degree above 1) is ddlsim's ZeRO-3 with the stack's per-block
FSDP2 units, with pipelining too; tensor parallelism is torchtitan's, with sequence
parallelism; ``[compile] enable`` is the stack's ``compile``; async TP is
``tp_comm_overlap: torch_async``. Op-level selective checkpointing is ``recompute: selective``
under the stack's ``selective_recompute``; ``[float8] recipe_name`` is the stack's
``fp8_recipe``; ``selective_ac_option = 'n'`` (every n-th block checkpointed) is
``recompute: full`` with ``recompute_every_n_layers: n``; HSDP (a replicate degree with a
shard degree) is ``data_parallel_replicate_size``; ``[float8] enable_fsdp_float8_all_gather``
and ``precompute_float8_dynamic_scale_for_fsdp`` are the stack's fields of those names where
torchtitan passes them to torchao (float8 converted, no ``recipe_name``, a shard degree other
than 1), else noted as without effect. What ddlsim cannot express yet (rowwise_with_gw_hp)
is refused by name.
"""

from __future__ import annotations

import tomllib
from ..errors import ConfigError
from .common import Draft
from .torchtitan_flavors import FLAVORS, flavor_refusal
from .torchtitan_quantize import read_compile as _compile

__all__ = ["read_torchtitan", "torchtitan_key_names"]

#: the software stack of this config format (torchtitan/config/job_config.py, 2025)
STACK = "torchtitan-2025"

#: sections that cannot change the time of one iteration
NO_EFFECT_SECTIONS = ("job", "profiling", "metrics", "checkpoint", "lr_scheduler", "comm",
                      "validation", "fault_tolerance", "memory_estimation")

_NO_EFFECT_KEYS = {"tokenizer_path", "hf_assets_path", "lr", "eps", "weight_decay", "beta1",
                   "beta2", "implementation", "early_step_in_backward", "steps",
                   "warmup_steps", "dataset", "dataset_path", "seed", "deterministic",
                   "gc_freq", "filter_fqns", "enable_compiled_autograd"}


def torchtitan_key_names() -> list[str]:
    """The sections and keys the importer reads."""
    return ["[model] name, flavor, converters", "[training] local_batch_size (batch_size), "
            "global_batch_size, seq_len, mixed_precision_param, mixed_precision_reduce, "
            "max_norm, compile, enable_cpu_offload", "[parallelism] data_parallel_*_degree, "
            "tensor_parallel_degree, pipeline_parallel_degree, context_parallel_degree, "
            "expert_parallel_degree, pipeline_parallel_schedule, "
            "pipeline_parallel_microbatch_size, pipeline_parallel_layers_per_stage, "
            "pipeline_parallel_first/last_stage_less_layers, module_fqns_per_model_part, "
            "pipeline_parallel_split_points (2024), context_parallel_rotate_method, "
            "enable_async_tensor_parallel", "[activation_checkpoint] mode, "
            "selective_ac_option", "[float8] recipe_name, enable_fsdp_float8_all_gather, "
            "precompute_float8_dynamic_scale_for_fsdp", "[quantize.linear.float8] (the same keys)",
            "[compile] enable, components", "[optimizer] name",
            *(f"[{s}]" for s in NO_EFFECT_SECTIONS)]


def read_torchtitan(text: str, where: str) -> Draft:
    """The ddlsim fields a torchtitan train config sets.

    Parameters
    ----------
    text : str
        The TOML text.
    where : str
        The source's name in notes and messages.

    Returns
    -------
    Draft
        The fields and the fate of every section and key.

    Raises
    ------
    ConfigError
        If ``text`` is not valid TOML.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    draft = Draft(where)
    from .torchtitan2024 import STACK_2024, is_2024, to_2025
    old = is_2024(doc)
    if old:
        doc = to_2025(doc, draft)
    readers = {"model": _model, "training": _training,
               "parallelism": lambda d, sec, whole: _parallelism(d, sec, whole, old),
               "activation_checkpoint": _checkpoint, "float8": _float8, "compile": _compile,
               "optimizer": _optimizer, "quantize": _quantize}
    for name, section in doc.items():
        if name in NO_EFFECT_SECTIONS:
            draft.note(f"[{name}]", "no effect on one iteration: logging, checkpoints, "
                                    "schedule or evaluation")
        elif name in readers and isinstance(section, dict):
            readers[name](draft, _typed(draft, name, section), doc)
        else:
            draft.refuse(f"[{name}]", "not a torchtitan section ddlsim reads")
    if old:
        draft.set("system.software.stack", STACK_2024, "torchtitan's config format of 2024 "
                  "(config_manager.py: [experimental], degrees under [training]): the "
                  "torchtitan-2024 stack")
    else:
        draft.set("system.software.stack", STACK, "torchtitan's config format "
                  "(job_config.py of 2025): the torchtitan-2025 stack; set "
                  "system.software.stack: torchtitan-2024 for a run of late 2024")
    return draft


#: keys whose value is a whole number, and keys whose value is a string
_INTS = {"local_batch_size", "batch_size", "global_batch_size", "seq_len",
         "data_parallel_replicate_degree", "data_parallel_shard_degree",
         "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
         "expert_parallel_degree", "pipeline_parallel_microbatch_size",
         "pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
         "pipeline_parallel_last_stage_less_layers"}
_STRINGS = {"name", "flavor", "mode", "recipe_name", "mixed_precision_param",
            "mixed_precision_reduce", "pipeline_parallel_schedule",
            "context_parallel_rotate_method", "fsdp_reshard_after_forward"}


def _typed(draft: Draft, section: str, items: dict) -> dict:
    """``items`` without the values of the wrong type, each refused by name."""
    out = {}
    for key, value in items.items():
        if key in _INTS and (type(value) is not int):
            draft.refuse(f"[{section}] {key} = {value!r}", "expects a whole number")
        elif key in _STRINGS and not isinstance(value, str):
            draft.refuse(f"[{section}] {key} = {value!r}", "expects a string")
        elif key == "converters" and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(v, str) for v in value))):
            draft.refuse(f"[{section}] {key} = {value!r}", "expects a list of names")
        else:
            out[key] = value
    return out


def _rest(draft: Draft, section: str, items: dict, done: set[str]) -> None:
    """Note or refuse the keys of ``items`` that a reader did not take."""
    for key, value in items.items():
        if key in done:
            continue
        if key in _NO_EFFECT_KEYS:
            draft.note(f"[{section}] {key} = {value!r}", "no effect on one iteration")
        else:
            draft.refuse(f"[{section}] {key} = {value!r}", "not a key ddlsim reads")


def _model(draft: Draft, s: dict, doc: dict) -> None:
    name, flavor = s.get("name"), str(s.get("flavor"))
    preset = FLAVORS.get(name, {}).get(flavor)
    if preset is None:
        draft.refuse(f"[model] name = {name!r}, flavor = {flavor!r}",
                     flavor_refusal(name, flavor))
    else:
        draft.set("model", preset, f"[model] {name} {flavor}")
    converters = s.get("converters", [])
    converters = [converters] if isinstance(converters, str) else list(converters)
    from .torchtitan_quantize import converter
    for c in converters:
        converter(draft, c, doc)
    _rest(draft, "model", s, {"name", "flavor", "converters"})


def _training(draft: Draft, s: dict, doc: dict) -> None:
    local = s.get("local_batch_size", s.get("batch_size"))
    par = doc.get("parallelism")
    pp = par.get("pipeline_parallel_degree", 1) if isinstance(par, dict) else 1
    if local is not None:
        if pp == 1:
            draft.set("train.micro_batch_size", local, "[training] local_batch_size")
        if s.get("global_batch_size", -1) == -1:
            draft.pending["batch_per_dp_rank"] = local
            draft.note("[training] global_batch_size = -1", "local_batch_size × DP")
    if s.get("global_batch_size", -1) != -1:
        draft.set("train.global_batch_size", s["global_batch_size"],
                  "[training] global_batch_size")
    if "seq_len" in s:
        draft.set("train.seq_length", s["seq_len"], "[training] seq_len")
    dtypes = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    param = s.get("mixed_precision_param", "bfloat16")
    if param not in dtypes:
        draft.refuse(f"[training] mixed_precision_param = {param!r}",
                     f"ddlsim models {', '.join(dtypes)}")
    elif draft.fields.get("train.dtype") != "fp8":
        draft.set("train.dtype", dtypes[param], "[training] mixed_precision_param")
    reduce = s.get("mixed_precision_reduce", "float32")
    draft.set("system.software.kernels.grad_reduce_dtype",
              "fp32" if reduce == "float32" else "param", "[training] mixed_precision_reduce")
    if "max_norm" in s:
        draft.unmodelled_arg(f"[training] max_norm = {s['max_norm']}", "the gradient norm "
                             "(one pass over the gradients and a scalar all-reduce)")
    if s.get("compile"):
        draft.set("system.software.compile", True, "[training] compile = true")
    if s.get("enable_cpu_offload"):
        draft.refuse("[training] enable_cpu_offload = true", "not modelled yet")
    _rest(draft, "training", s, {"local_batch_size", "batch_size", "global_batch_size",
                                 "seq_len", "mixed_precision_param", "mixed_precision_reduce",
                                 "max_norm", "compile", "enable_cpu_offload"})


#: torchtitan's [parallelism] degrees and the ddlsim fields they set (also the config's hints)
DEGREE_FIELDS = {"tensor_parallel_degree": "parallel.tensor_model_parallel_size",
                 "pipeline_parallel_degree": "parallel.pipeline_model_parallel_size",
                 "context_parallel_degree": "parallel.context_parallel_size",
                 "expert_parallel_degree": "parallel.expert_model_parallel_size"}


def _parallelism(draft: Draft, s: dict, doc: dict, old: bool = False) -> None:
    for key, path in DEGREE_FIELDS.items():
        if key in s:
            draft.set(path, s[key], f"[parallelism] {key} = {s[key]}")
    if s.get("tensor_parallel_degree", 1) > 1:
        draft.set("parallel.sequence_parallel", True, "torchtitan's TP plan shards the norms "
                  "over the sequence (SequenceParallel: parallelize.py apply_tp)")
    _data_parallel(draft, s)
    _pipeline(draft, s, doc, old)
    if s.get("context_parallel_degree", 1) > 1:
        method = s.get("context_parallel_rotate_method", "allgather")
        if method == "allgather":
            draft.set("parallel.cp_comm_type", "all_gather", "context_parallel_rotate_method")
        elif method == "alltoall":   # torch's _AllToAllRotater: a permute to +1 per ring step
            draft.set("parallel.cp_comm_type", "p2p", "context_parallel_rotate_method "
                      "'alltoall' (torch's per-step K/V permute: partition/torch_cp.py)")
        else:
            draft.refuse(f"[parallelism] context_parallel_rotate_method = {method}",
                         "not modelled yet")
    if s.get("enable_async_tensor_parallel"):
        draft.set("parallel.tp_comm_overlap", "torch_async", "[parallelism] "
                  "enable_async_tensor_parallel = true (torch's micro-pipelined TP)")
    if s.get("disable_loss_parallel"):
        draft.refuse("[parallelism] disable_loss_parallel = true", "not modelled yet")
    policy = s.get("fsdp_reshard_after_forward", "default")
    fsdp = s.get("data_parallel_shard_degree", -1) != 1 or s.get("context_parallel_degree", 1) > 1
    if policy in ("always", "never") and not fsdp:
        draft.note(f"[parallelism] fsdp_reshard_after_forward = {policy}",
                   "unread: torchtitan passes it to apply_fsdp only, and this run has no FSDP "
                   "(data_parallel_shard_degree 1, no context parallelism)")
    elif policy in ("always", "never"):
        draft.set("system.software.overlap.zero3_reshard_after_forward", policy,
                  f"[parallelism] fsdp_reshard_after_forward = {policy}")
    elif policy != "default":
        draft.refuse(f"[parallelism] fsdp_reshard_after_forward = {policy!r}",
                     "torchtitan takes default, always or never")
    _rest(draft, "parallelism", s, {
        *DEGREE_FIELDS, "data_parallel_replicate_degree", "data_parallel_shard_degree",
        "disable_loss_parallel", "pipeline_parallel_schedule", "fsdp_reshard_after_forward",
        "pipeline_parallel_microbatch_size", "context_parallel_rotate_method",
        "enable_async_tensor_parallel", *_SPLIT_KEYS})


def _data_parallel(draft: Draft, s: dict) -> None:
    """FSDP (a shard degree other than 1, or context parallelism: torchtitan shards over
    dp_shard × cp) is ZeRO-3 with the stack's per-block units, with pipelining too; replicas
    alone are DDP; both are HSDP (``data_parallel_replicate_size``: replicas of the shards)."""
    replicate = s.get("data_parallel_replicate_degree", 1)
    shard = s.get("data_parallel_shard_degree", -1)
    cp = s.get("context_parallel_degree", 1)
    keys = (f"[parallelism] data_parallel_replicate_degree = {replicate}, "
            f"data_parallel_shard_degree = {shard}")
    if shard != 1 or cp > 1:
        draft.set("parallel.zero_stage", 3, f"[parallelism] data_parallel_shard_degree = "
                  f"{shard} (FSDP2 per transformer block: ZeRO-3)")
    if replicate > 1 and (shard != 1 or cp > 1):
        draft.set("parallel.data_parallel_replicate_size", replicate, f"{keys} (HSDP: "
                  "gradients reduce-scattered in a shard group, all-reduced across replicas)")
        if shard == -1:     # the shards fill the rest of the ranks: DP is what is left
            return
        draft.set("parallel.data_parallel_size", replicate * shard,
                  f"{keys}: data parallelism is replicas × shards")
    elif shard > 1 or replicate > 1:
        draft.set("parallel.data_parallel_size", max(shard, replicate),
                  "[parallelism] data-parallel degree")


#: [parallelism] keys of torchtitan's layer split (2025; split points: 2024's, moved here)
_SPLIT_KEYS = ("pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
               "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_split_points",
               "module_fqns_per_model_part")
#: torchtitan's pipeline schedules ddlsim runs → (ddlsim's schedule, multi-stage)
_SCHEDULES = {"1F1B": ("1f1b", False), "GPipe": ("gpipe", False),
              "Interleaved1F1B": ("interleaved", True)}


def _pipeline(draft: Draft, s: dict, doc: dict, old: bool) -> None:
    """The pipeline schedule, micro-batch and layer split when there are pipeline stages."""
    pp = s.get("pipeline_parallel_degree", 1)
    if pp == 1:
        for key in _SPLIT_KEYS:
            if key in s:
                draft.note(f"[parallelism] {key}", "no effect without pipeline stages")
        return
    name = s.get("pipeline_parallel_schedule", "1F1B")
    # torch's get_schedule_class matches the name whatever its case (torch/distributed/
    # pipelining/schedules.py, schedule_name.lower()): "interleaved1f1b" is Interleaved1F1B
    name = {k.lower(): k for k in _SCHEDULES}.get(str(name).lower(), name)
    if name not in _SCHEDULES:
        draft.refuse(f"[parallelism] pipeline_parallel_schedule = {name}",
                     f"ddlsim maps {', '.join(_SCHEDULES)} (not modelled yet)")
        return
    schedule, multi = _SCHEDULES[name]
    draft.set("parallel.schedule", schedule, f"[parallelism] pipeline_parallel_schedule = {name}")
    draft.set("train.micro_batch_size", s.get("pipeline_parallel_microbatch_size", 1),
              "[parallelism] pipeline_parallel_microbatch_size")
    _layer_split(draft, s, doc, old, pp, multi)


def _layer_split(draft: Draft, s: dict, doc: dict, old: bool, pp: int, multi: bool) -> None:
    """torchtitan's split of the layers over the virtual stages (:mod:`.torchtitan_split`):
    the run's own (split points, module names) or the one torchtitan derives for a model of a
    known flavor, as ``parallel.layers_per_virtual_stage``."""
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    name = model.get("name")      # [model] refuses a name that is not a string, by name
    preset = FLAVORS.get(name if isinstance(name, str) else "", {}).get(str(model.get("flavor")))
    keys = f"[parallelism] pipeline_parallel_degree = {pp}" + "".join(
        f", {k}" for k in _SPLIT_KEYS if k in s)
    layers = None
    if preset is not None:
        from ..configload import resolve_section
        layers = resolve_section("model", preset)["num_hidden_layers"]
    try:
        from .torchtitan_split import run_split
        split = run_split(s, old, layers, pp, multi)
    except ValueError as exc:
        draft.refuse(keys, str(exc))
        return
    if split is None:
        draft.refuse(keys, "torchtitan splits the layers by the model's layer count; for a "
                     "model without a known flavor give the split with --set "
                     "parallel.layers_per_virtual_stage=[...]")
        return
    if len(split) > pp:
        draft.set("parallel.virtual_pipeline_model_parallel_size", len(split) // pp,
                  f"{keys}: {len(split)} virtual stages")
    draft.set("parallel.layers_per_virtual_stage", split, f"{keys}: torchtitan's split "
              f"({'9dec370' if old else '07c00d9'})")


def _checkpoint(draft: Draft, s: dict, doc: dict) -> None:
    mode, option = s.get("mode", "selective"), str(s.get("selective_ac_option", "2"))
    arg = f"[activation_checkpoint] mode = {mode!r}"
    if mode in ("none", "full"):
        draft.set("train.recompute", mode, arg)
    elif mode == "selective" and option in ("0", "1"):
        draft.set("train.recompute", "full", f"{arg}, selective_ac_option = {option} (every "
                  "layer)")
    elif mode == "selective" and option.isdigit():
        draft.set("train.recompute", "full", f"{arg}, selective_ac_option = {option} (every "
                  f"{option}-th layer checkpointed fully)")
        draft.set("train.recompute_every_n_layers", int(option),
                  f"{arg}, selective_ac_option = {option}: the rank's {option}-th, "
                  f"{2 * int(option)}-th, … block (torchtitan's layer counter)")
    elif mode == "selective" and option == "op":
        draft.set("train.recompute", "selective", f"{arg}, selective_ac_option = 'op' (the "
                  "stack's selective_recompute: every second mm and the element-wise ops)")
    else:
        draft.refuse(f"{arg}, selective_ac_option = {option!r}", "torchtitan takes mode "
                     "none, full or selective, and selective_ac_option 'op' or a whole number")
    _rest(draft, "activation_checkpoint", s, {"mode", "selective_ac_option"})


def _float8(draft: Draft, s: dict, doc: dict, section: str = "float8") -> None:
    """``[float8]`` (or, after torchtitan 8a2686c, ``[quantize.linear.float8]``)."""
    recipe = s.get("recipe_name")
    if recipe in ("tensorwise", "rowwise"):
        draft.set("system.software.kernels.fp8_recipe", recipe,
                  f"[{section}] recipe_name = {recipe!r}")
    elif recipe is not None:
        draft.refuse(f"[{section}] recipe_name = {recipe!r}", "not modelled yet (ddlsim's "
                     "recipes: tensorwise, rowwise; simulator/kernels/fp8recipe.py)")
    from .torchtitan_float8 import fsdp_float8
    fsdp_float8(draft, s, doc, recipe)
    _rest(draft, section, s, {"recipe_name", "enable_fsdp_float8_all_gather",
                              "precompute_float8_dynamic_scale_for_fsdp"})


def _quantize(draft: Draft, s: dict, doc: dict) -> None:
    from .torchtitan_quantize import read_quantize
    read_quantize(draft, s, doc, _float8)


def _optimizer(draft: Draft, s: dict, doc: dict) -> None:
    name = str(s.get("name", "AdamW"))
    if name.lower() in ("adam", "adamw"):
        draft.set("train.optimizer", "adam", f"[optimizer] name = {name}")
    else:
        draft.refuse(f"[optimizer] name = {name}", "ddlsim models Adam(W) and SGD")
    _rest(draft, "optimizer", s, {"name"})

