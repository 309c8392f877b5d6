"""Configs as users have them → a ddlsim run config (``ddlsim import``).

Readers, one registration each (:func:`register_importer`), keyed by the name ``--from``
takes: ``megatron`` (a ``pretrain_gpt.py`` command line or launch script), ``modelzoo``
(Megatron-MoE-ModelZoo's run scripts and model YAMLs, read through the Megatron-LM command
they build), ``deepspeed`` (a
``ds_config.json``), ``torchtitan`` (a train TOML) and ``hf`` (a Hugging Face model folder or
its ``config.json``). Each maps every argument it reads or refuses it by name
(:mod:`.common`); :func:`import_config` merges the sources, adds the system the user names,
applies ``--set`` overrides and validates the result as ``ddlsim predict`` would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError, did_you_mean
from .common import _IMPORTERS, Draft, Importer, merge_drafts, nested, refuse_unknown, \
    register_importer

__all__ = ["Importer", "register_importer", "importers", "detect", "import_config",
           "Imported"]


def importers() -> dict[str, Importer]:
    """The registered readers by name (importing the modules that register them)."""
    from . import readers  # noqa: F401  (registers)
    return dict(_IMPORTERS)


def detect(path: Path) -> str:
    """The reader for ``path``: a folder or a JSON with ``model_type`` is a Hugging Face
    model, other JSON a DeepSpeed config, ``.toml`` torchtitan, ``.yaml`` a ModelZoo model
    YAML, a script that runs ``sbatch_benchmarking.sh`` a ModelZoo launcher, anything else
    Megatron-LM arguments."""
    from ..textio import read_text
    if path.is_dir():
        return "hf"
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return "torchtitan"
    if suffix in (".yaml", ".yml"):
        return "modelzoo"
    if suffix == ".json":
        from ..documents import parse_json
        doc = parse_json(read_text(path, what="JSON file"), str(path))
        return "hf" if isinstance(doc, dict) and "model_type" in doc else "deepspeed"
    from .modelzoo import is_modelzoo_launcher
    return "modelzoo" if is_modelzoo_launcher(read_text(path, what="script")) else "megatron"


class Imported(NamedTuple):
    """An imported run config (sections as mappings) and the drafts it came from."""

    config: dict[str, Any]
    drafts: list[Draft]


def import_config(paths: list[str | Path], *, kind: str | None = None,
                  system: str | None = None, nodes: int | None = None,
                  software: str | None = None, ignore: tuple[str, ...] = (),
                  overrides: tuple[str, ...] = (), repo: str | Path | None = None,
                  env: tuple[str, ...] = ()) -> Imported:
    """Read ``paths`` (each with the reader ``kind`` names, or the one :func:`detect` picks)
    into one run config.

    Parameters
    ----------
    paths : list of path
        Files (or a Hugging Face model folder) to read; fields two of them set must agree.
    kind : str, optional
        The reader for every path (``megatron``, ``deepspeed``, ``torchtitan``, ``hf``).
    system : str, optional
        The system preset (``dgx-h100``); required unless an override gives ``system``.
    nodes : int, optional
        Nodes of the system; replaces the launcher's ``--nnodes``.
    software : str, optional
        The software stack (``system.software``); a DeepSpeed config implies ``deepspeed``.
    ignore : tuple of str
        Arguments to leave out instead of refusing them (listed as ignored).
    overrides : tuple of str
        ``section.key=value`` items applied last, as ``predict --set``.
    repo : path, optional
        The Megatron-MoE-ModelZoo checkout a ModelZoo run script runs in.
    env : tuple of str
        ``NAME=value`` variables of the environment a ModelZoo launcher runs in.

    Returns
    -------
    Imported
        The run config as a mapping (loads with :func:`ddlsim.load_config`) and the drafts.

    Raises
    ------
    ConfigError
        Naming each argument that cannot be mapped, a conflict between sources, or a field
        of the result that ddlsim refuses.
    """
    table = importers()
    if kind is not None and kind not in table:
        raise ConfigError(f"--from {kind!r} is not a reader{did_you_mean(kind, table)}; "
                          f"allowed: {', '.join(table)}")
    options = {"repo": None if repo is None else Path(repo), "env": tuple(env)}
    drafts, readers = [], []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p}: no such file or folder")
        reader = table[kind or detect(p)]
        readers.append(reader)
        draft = reader.read(p, **{k: options[k] for k in reader.options})
        refuse_unknown(draft, set(ignore), reader.known(), reader.what, reader.name)
        drafts.append(draft)
    _check_options(options, readers, table)
    drafts.append(_system_draft(drafts, system, nodes, software))
    if software is None and {"deepspeed", "hf"} <= {r.name for r in readers}:
        _hf_under_deepspeed(drafts[-1])
    fields = merge_drafts(drafts)
    return Imported(_finish(fields, overrides, drafts), drafts)


def _check_options(options: dict[str, Any], readers: list[Importer],
                   table: dict[str, Importer]) -> None:
    """Refuse ``--repo``/``--env`` where no source's reader takes them."""
    for name, value in options.items():
        if value and not any(name in r.options for r in readers):
            takers = [r.what for r in table.values() if name in r.options]
            raise ConfigError(f"--{name} is read with a {' or '.join(takers)} only; no source "
                              "here is one")


def _system_draft(drafts: list[Draft], system: str | None, nodes: int | None,
                  software: str | None) -> Draft:
    """The options' draft: the system preset, the nodes (over the launcher's) and the stack."""
    d = Draft("the import options")
    if system is not None:
        d.set("system.preset", system, f"--system {system}")
    if nodes is not None:
        for other in drafts:
            launcher = other.fields.pop("system.nodes", None)
            if launcher is not None and launcher != nodes:
                other.note("--nnodes", f"replaced by --nodes {nodes} (the launcher had "
                                       f"{launcher})")
        d.set("system.nodes", nodes, f"--nodes {nodes}")
    if software is not None:
        for other in drafts:
            stack = other.fields.get("system.software.stack")
            if stack is not None and stack != software:
                raise ConfigError(f"--software {software} contradicts {other.source}, which "
                                  f"is a {stack} config")
        d.set("system.software.stack", software, f"--software {software}")
    return d


#: transformers' model code as it differs from the ``deepspeed`` stack's (Megatron-DeepSpeed's),
#: for :func:`_hf_under_deepspeed`: what a run of a Hugging Face model under the Trainer or
#: Accelerate executes (huggingface/transformers 00227283 models/llama/modeling_llama.py:
#: q_proj, k_proj, v_proj and gate_proj, up_proj are separate nn.Linear; attention by
#: attn_implementation, "sdpa" or "flash_attention_2", no fused scale-mask-softmax)
HF_MODEL_CODE = ("system.software.kernels.attention=flash2",
                 "system.software.kernels.separate_projections=true")


def _hf_under_deepspeed(draft: Draft) -> None:
    """A ds_config with a Hugging Face model and no ``--software``: the ``deepspeed`` stack
    the ds_config implies runs Megatron-DeepSpeed's model code, which a Hugging Face Trainer
    or Accelerate run does not; say so in the YAML and once on standard error, with the
    ``--set`` values for transformers' code, rather than choose silently."""
    import warnings

    from ..errors import DDLSimWarning
    what = ("the deepspeed stack (implied by the ds_config) runs Megatron-DeepSpeed's model "
            "code: Megatron's fused scale-mask-softmax attention (the scores in memory) and "
            "one QKV GEMM; a Hugging Face Trainer or Accelerate run executes transformers' "
            "code (SDPA or FlashAttention-2, separate q/k/v and gate/up projections): add "
            + " ".join(f"--set {s}" for s in HF_MODEL_CODE) + " for it")
    draft.note("ds_config with a Hugging Face model", what)
    warnings.warn(what, DDLSimWarning, stacklevel=3)


def _finish(fields: dict[str, Any], overrides: tuple[str, ...],
            drafts: list[Draft]) -> dict[str, Any]:
    """Nested sections, the stack written by name when nothing overrides it, the overrides
    applied; refused when the system has no preset or nodes, or when ddlsim rejects it."""
    from ..config import apply_overrides, build_config
    from ..configpresets import preset_overrides
    from ..presets import SECTIONS

    config = nested(fields)
    sw = config.get("system", {}).get("software")
    if isinstance(sw, dict) and set(sw) == {"stack"}:
        config["system"]["software"] = sw["stack"]
    # --set SECTION=NAME (a preset for a section the sources leave out, as predict's --set
    # takes it) first; SECTION.key=VALUE, SECTION.preset=NAME among them, set one key each
    whole = [o for o in overrides if "." not in str(o).partition("=")[0]]
    config, _ = preset_overrides(config, whole, SECTIONS)
    config = apply_overrides(config, [o for o in overrides if o not in whole])
    system = config.get("system", {})
    missing = [w for w, ok in (("--system PRESET (e.g. dgx-h100; `ddlsim presets system`)",
                                "preset" in system or "device" in system),
                               ("--nodes N", "nodes" in system)) if not ok]
    if missing:
        raise ConfigError("the system is not in these files: give " + " and ".join(missing))
    for d in drafts:
        if "gradient_accumulation_steps" in d.pending or "batch_per_dp_rank" in d.pending:
            _accumulation(config, d)
        if "no_masked_softmax_fusion" in d.pending:
            from .megatron_notes import masked_softmax
            masked_softmax(config, d)
    try:
        build_config(config)    # refused here as predict would refuse it
    except ConfigError as exc:
        missing = "Field required" in str(exc) or "section" in str(exc)
        devices = "data_parallel_size" in str(exc) or "devices" in str(exc)
        nodes = system.get("nodes")
        raise type(exc)(f"the imported config: {exc}" + (
            ". Give what the sources do not say with --set (e.g. --set model.preset="
            "llama-3-8b, --set train.seq_length=4096) or another source (a Hugging Face "
            "model folder)" if missing else "") + (
            f" (the import has system.nodes = {nodes}: --nodes N imports the plan for a "
            "cluster of N nodes)" if devices and not missing else "")) from None
    return config


def _accumulation(config: dict[str, Any], draft: Draft) -> None:
    """DeepSpeed's rule ``train_batch_size = micro-batch × accumulation steps × DP`` (the
    missing one of the three derived, or the three checked), or torchtitan's default global
    batch, ``local_batch_size × DP``."""
    from ..configload import resolve_section

    system = resolve_section("system", config["system"])
    p, train = config.get("parallel", {}), config.setdefault("train", {})
    counts = [system.get("nodes", 0), system.get("devices_per_node", 0),
              p.get("tensor_model_parallel_size", 1), p.get("pipeline_model_parallel_size", 1),
              p.get("context_parallel_size", 1), p.get("data_parallel_size") or 0,
              train.get("micro_batch_size") or 0, train.get("global_batch_size") or 0]
    if not all(type(c) is int and c >= 0 for c in counts):
        return      # a count of the wrong kind: the config's own check names it
    nodes, per_node, tp, pp, cp = counts[:5]
    dp = p.get("data_parallel_size") or nodes * per_node // max(1, tp * pp * cp)
    mbs, gbs = train.get("micro_batch_size"), train.get("global_batch_size")
    if "batch_per_dp_rank" in draft.pending:     # torchtitan: global = local batch × DP
        local = draft.pending["batch_per_dp_rank"]
        train["global_batch_size"] = local * dp
        draft.note("[training] local_batch_size", f"train.global_batch_size: {local} × DP {dp}")
        return
    gas = draft.pending["gradient_accumulation_steps"]
    arg = f"gradient_accumulation_steps: {gas}"
    if not isinstance(gas, int) or isinstance(gas, bool) or gas < 1 or not dp:
        raise ConfigError(f"{draft.source}: {arg} must be a whole number >= 1 on a plan with "
                          "data parallelism")
    if gbs is None and mbs is not None:
        train["global_batch_size"] = mbs * gas * dp
        draft.note(arg, f"train.global_batch_size: {mbs} × {gas} × DP {dp}")
    elif mbs is None and gbs is not None and gbs % (gas * dp) == 0:
        train["micro_batch_size"] = gbs // (gas * dp)
        draft.note(arg, f"train.micro_batch_size: {gbs} / ({gas} × DP {dp})")
    elif mbs is None or gbs != mbs * gas * dp:
        raise ConfigError(f"{draft.source}: train_batch_size {gbs} is not "
                          f"train_micro_batch_size_per_gpu {mbs} × {arg} × DP {dp}, as "
                          f"DeepSpeed requires{_nodes_for(gbs, mbs, gas, tp * pp * cp, per_node)}")


def _nodes_for(gbs: Any, mbs: Any, gas: int, model_parallel: int, per_node: int) -> str:
    """``"; it holds at DP 256: 256 GPUs, --nodes 32 at 8 a node"``: the cluster on which
    ``gbs`` is ``mbs × gas × DP`` (a ds_config states its batch, not its GPUs), or ``""``
    where no whole number of nodes gives it."""
    if not (isinstance(gbs, int) and isinstance(mbs, int) and mbs > 0 and per_node > 0
            and gbs % (mbs * gas) == 0):
        return ""
    dp = gbs // (mbs * gas)
    ranks = dp * model_parallel
    if ranks % per_node:
        return ""
    return (f"; it holds at DP {dp}: {ranks} GPUs, --nodes {ranks // per_node} at "
            f"{per_node} a node")
