"""Workload families as plugins: ``@register_workload("<architecture>")``.

A *family* is everything ddlsim knows about one kind of model: its section of the run config
(a pydantic model, one arm of a union discriminated on ``model.architecture``), the plan rules
that involve the model, the trace builder, the memory per rank class, a one-line summary and
its presets, and optionally its own plan line (:meth:`WorkloadFamily.plan_summary`). ``RunConfig``, :func:`ddlsim.api.build_workload`, the
report header and ``ddlsim presets`` look families up here and contain no code of any family.

Adding a family is one package under ``ddlsim/workloads/`` that subclasses
:class:`WorkloadFamily` and decorates it with :func:`register_workload`, plus one line naming
the package in :data:`BUILTIN_FAMILIES` (or an ``import`` of the package by the user before
loading a config): see ``docs/extending.md``.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..config import RunConfig
    from .memory import MemoryBreakdown
    from .trace import Workload

__all__ = ["WorkloadFamily", "register_workload", "batch_phrase", "get_family", "families",
           "iter_families", "BASE_PLAN_FIELDS", "check_plan_fields",
           "hf_family", "read_presets", "expand_hf_config", "unmodelled_warning", "validate_model",
           "BUILTIN_FAMILIES", "ARCHITECTURE_DEFAULT"]

#: Packages whose import registers the bundled families (one line per family).
BUILTIN_FAMILIES: tuple[str, ...] = (
    "ddlsim.workloads.decoder",
    "ddlsim.workloads.cosmoflow",
    "ddlsim.workloads.dlrm",
    "ddlsim.workloads.resnet",
    "ddlsim.workloads.bert",
)
#: The architecture of a model section that names none (today's configs are all GPT).
ARCHITECTURE_DEFAULT = "gpt"

#: The plan fields every bundled family reads: the mesh's sizes (a family without tensor,
#: pipeline or expert parallelism reads them to refuse a size above 1), the data-parallel
#: update, the collective choices and the rank order (read by the engines and the mesh), and
#: the batch. A family lists these and its own in :attr:`WorkloadFamily.plan_fields`
#: (``parallel.collective_buffers`` only where its trace keeps one-rank collectives:
#: :mod:`.onerankcopy`).
BASE_PLAN_FIELDS: tuple[str, ...] = (
    "parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size",
    "parallel.expert_model_parallel_size", "parallel.data_parallel_size",
    "parallel.zero_stage", "parallel.dp_strategy", "parallel.collective_algorithm",
    "parallel.rank_order", "train.micro_batch_size",
    "train.global_batch_size", "train.seq_length", "train.dtype", "train.optimizer")

_FAMILIES: dict[str, "WorkloadFamily"] = {}
_HF_TYPES: dict[str, "WorkloadFamily"] = {}


class WorkloadFamily(ABC):
    """One model family. Subclass it, set the class attributes, implement the methods.

    Attributes
    ----------
    architecture : str
        The value of ``model.architecture`` that selects this family (set by
        :func:`register_workload`).
    schema : type of pydantic.BaseModel
        The model section: fields ``name``, ``architecture`` (a ``Literal`` of this
        architecture, defaulting to it), ``source`` and the family's own fields.
    presets_file : str or None
        A YAML file in ``ddlsim/data`` (or any package, as ``"package:file"``) mapping preset
        names to model sections, each with a ``source``.
    hf_model_types : tuple of str
        HuggingFace ``model_type`` values whose ``config.json`` it reads (:meth:`from_hf`).
    plan_fields : tuple of str or None
        The plan fields (``"parallel.…"``, ``"train.…"``) its rules or trace read, e.g.
        :data:`BASE_PLAN_FIELDS` and its own; a config that sets any other one off its
        default is refused (:func:`check_plan_fields`), so no option is ignored silently,
        and a field added to the plan later stays refused until the family reads it.
        ``None`` (the default): every field (the decoder families).
    sample_length : int or None
        ``train.seq_length`` where the config leaves it unset: 1 for a family whose sample is
        one image, volume or row of features; ``None`` (the default): a sequence model's,
        which the config must give.
    """

    architecture: ClassVar[str] = ""
    sample_length: ClassVar[int | None] = None
    schema: ClassVar[type["BaseModel"]]
    presets_file: ClassVar[str | None] = None
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    plan_fields: ClassVar[tuple[str, ...] | None] = None

    def check(self, cfg: "RunConfig") -> None:
        """Raise ``ValueError`` (one paragraph: field, value, what is allowed) when the plan
        does not suit the model (e.g. heads not divisible by the tensor-parallel size)."""

    @abstractmethod
    def build(self, cfg: "RunConfig") -> "Workload":
        """The trace of one training iteration of ``cfg``."""

    @abstractmethod
    def memory(self, cfg: "RunConfig") -> list["MemoryBreakdown"]:
        """Memory of one rank of each rank class that differs (e.g. per pipeline stage)."""

    def summary(self, model: Any) -> str:
        """One line describing ``model`` (a validated :attr:`schema` instance)."""
        return f"{model.name} ({self.architecture})"

    def plan_summary(self, cfg: "RunConfig") -> str:
        """One line describing how ``cfg`` spreads the model over its ranks, for the report
        header (after the system). The default is Megatron-LM's vocabulary: tensor ×
        pipeline × data parallel, schedule, ZeRO, the seed wiki's data-parallel update where
        it is not DDP's (``dp_strategy reduce_broadcast``), micro-batches, sequence, dtype
        and recomputation; families whose plan has other axes or lacks these override it."""
        p, t = cfg.parallel, cfg.train
        # the seed wiki's updates are named; ddp, the framework's own, is the ZeRO stage's
        update = "" if p.dp_strategy == "ddp" else f", dp_strategy {p.dp_strategy}"
        return (f"TP{p.tp} × PP{p.pp}{f'(v{p.vpp})' if p.vpp > 1 else ''} × DP{cfg.dp} = "
                f"{cfg.world_size} ranks, {p.schedule}, ZeRO-{p.zero_stage}{update}, "
                f"{batch_phrase(cfg)}, seq {t.seq_length}, {t.dtype}, "
                f"recompute {t.recompute}"
                + (f" every {t.recompute_every_n_layers} layers" if t.recompute_every_n_layers > 1
                   else "")
                + (f" ({', '.join(t.recompute_modules)})" if t.recompute_modules else ""))

    def group_labels(self, cfg: "RunConfig") -> dict[str, str]:
        """Group kind → how the report names it for ``cfg`` (e.g. ``tp`` → ``tp (2-D grid:
        tp_col, tp_row)``); kinds not listed are shown as they are."""
        return {}

    def plan_from_model(self, model: Any) -> dict[str, Any]:
        """``ParallelConfig`` fields that ``model`` determines (CosmoFlow's spatial group
        from its grid): a config that leaves one unset gets it, one that sets it is judged
        by :meth:`check`. Default: none."""
        return {}

    def moe_plan(self, cfg: "RunConfig") -> Any | None:
        """The resolved Mixture-of-Experts options of ``cfg`` (the dispatcher, the overlap
        flags, ...) that the stack rules read (:mod:`ddlsim.stackrules`); None (the default)
        for a family without expert layers or a dense model.

        Raises
        ------
        ConfigError
            When an option is unset and the stack does not say it.
        """
        return None

    def from_hf(self, doc: dict, source: str) -> tuple[dict, list[str]]:
        """A model section from a HuggingFace ``config.json`` of one of
        :attr:`hf_model_types`, and the keys not modelled (for one warning line)."""
        raise ConfigError(f"{source}: the {self.architecture} family reads no HuggingFace "
                          "config.json")

    def presets(self) -> dict[str, dict]:
        """Preset name → model section (raw mapping, with ``source``)."""
        return read_presets(self.presets_file) if self.presets_file else {}


def batch_phrase(cfg: "RunConfig", per: str = "replica") -> str:
    """``micro-batch b × m per replica, global batch B``: the micro-batch size, the
    micro-batches one data-parallel ``per`` runs in an iteration and the global batch."""
    t = cfg.train
    return (f"micro-batch {t.micro_batch_size} × {cfg.num_microbatches} per {per}, global "
            f"batch {t.global_batch_size}")


def register_workload(architecture: str) -> Callable[[type[WorkloadFamily]], type[WorkloadFamily]]:
    """Class decorator: register a :class:`WorkloadFamily` subclass under ``architecture``.

    Registering a second family under a name already taken is refused (a plugin must not
    silently replace another); registering the same class again is a no-op.
    """
    def decorate(cls: type[WorkloadFamily]) -> type[WorkloadFamily]:
        if "ignores" in vars(cls):
            raise ConfigError(f"workload family {cls.__qualname__} sets 'ignores', a list of the "
                              "plan fields it does not read; declare those it reads instead, "
                              "as plan_fields (docs/extending.md)")
        old = _FAMILIES.get(architecture)
        if old is not None and type(old) is not cls:
            raise ConfigError(f"workload architecture {architecture!r} is already registered "
                              f"by {type(old).__qualname__}; choose another name")
        cls.architecture = architecture
        family = cls()
        _FAMILIES[architecture] = family
        for mt in cls.hf_model_types:
            _HF_TYPES[mt] = family
        return cls
    return decorate


@cache
def _load_builtins() -> None:
    for package in BUILTIN_FAMILIES:
        importlib.import_module(package)


def families() -> dict[str, WorkloadFamily]:
    """Every registered family, by architecture (the bundled ones are imported first)."""
    _load_builtins()
    return dict(_FAMILIES)


def iter_families() -> Iterator[tuple[str, WorkloadFamily]]:
    """The registered families in :func:`families`' order, importing the bundled packages
    one at a time, so that a lookup the first ones answer (``gpt``, a GPT preset) does not
    import the others (a prediction's start-up time)."""
    seen: set[str] = set()
    for package in (*BUILTIN_FAMILIES, None):
        for arch, family in list(_FAMILIES.items()):
            if arch not in seen:
                seen.add(arch)
                yield arch, family
        if package is not None:
            importlib.import_module(package)


def get_family(architecture: Any) -> WorkloadFamily:
    """The family registered under ``architecture``.

    Raises
    ------
    ConfigError
        Naming the value, the closest registered name and every registered one.
    """
    if isinstance(architecture, str):
        family = _FAMILIES.get(architecture)
        if family is not None:   # registered already (a config validated asks ~3 times)
            return family
        for arch, family in iter_families():
            if arch == architecture:
                return family
    known = families()
    if not isinstance(architecture, str) or architecture not in known:
        raise ConfigError(f"model.architecture = {architecture!r} is not a registered workload "
                          f"family{did_you_mean(str(architecture), known)}; allowed: "
                          f"{', '.join(sorted(known))}")
    return known[architecture]


def validate_model(value: Any) -> Any:
    """A model section validated by the schema of its family (chosen by ``architecture``,
    default :data:`ARCHITECTURE_DEFAULT`): the union of every family's schema, discriminated
    on ``architecture``.

    Raises
    ------
    ConfigError
        An unknown architecture (with the registered ones); pydantic's ``ValidationError``
        for the family schema's own problems.
    """
    from ..config_types import ModelBase

    if isinstance(value, ModelBase):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"the model section must be a mapping of its fields; got "
                          f"{type(value).__name__}")
    return get_family(value.get("architecture", ARCHITECTURE_DEFAULT)).schema.model_validate(value)


def hf_family(model_type: Any, source: str) -> WorkloadFamily:
    """The family that reads HuggingFace configs of ``model_type``."""
    families()
    if not isinstance(model_type, str) or model_type not in _HF_TYPES:
        from ..configpresets import not_bundled
        why = not_bundled(model_type=model_type)
        if why:
            raise ConfigError(f"{source}: {why}; supported model types: "
                              f"{', '.join(sorted(_HF_TYPES))}")
        raise ConfigError(f"{source}: model_type = {model_type!r} is not a HuggingFace model "
                          f"type ddlsim reads{did_you_mean(str(model_type), _HF_TYPES)}; "
                          f"supported: {', '.join(sorted(_HF_TYPES))}")
    return _HF_TYPES[model_type]


def read_presets(spec: str) -> dict[str, dict]:
    """The presets in a YAML resource: ``file`` in ``ddlsim.data`` or ``package:file``."""
    from importlib import resources

    from ..documents import load_bundled_yaml

    package, _, name = spec.rpartition(":")
    text = resources.files(package or "ddlsim.data").joinpath(name).read_text()
    return load_bundled_yaml(text) or {}


def _bundled_hf() -> dict[str, Any]:
    """Bundled ``config.json`` files (``ddlsim/data/hf``) by name: the file's stem, the stem
    without ``-hf``, and the decoder preset names of ``decoders.yaml``."""
    from importlib import resources

    folder = resources.files("ddlsim.data").joinpath("hf")
    out = {}
    for f in sorted(folder.iterdir(), key=lambda f: f.name):
        if f.name.endswith(".json"):
            stem = f.name.removesuffix(".json")
            out[stem] = f
            out.setdefault(stem.removesuffix("-hf"), f)
    for name, p in read_presets("decoders.yaml").items():
        out.setdefault(name, folder.joinpath(p["hf_config"].removeprefix("hf/")))
    return out


def _hf_document(spec: Any, base_dir: Any) -> tuple[dict, str]:
    """The parsed ``config.json`` that ``spec`` names, and a label for messages."""
    from pathlib import Path

    from ..documents import parse_json
    from ..textio import read_text

    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"model.hf_config = {spec!r} must be a path to a HuggingFace "
                          "config.json or the name of a bundled one")
    bundled = _bundled_hf()
    if spec in bundled and "/" not in spec and not spec.endswith(".json"):
        text, label = bundled[spec].read_text(encoding="utf-8"), f"bundled config.json {spec!r}"
    else:
        path = Path(spec).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.exists() and "/" not in spec and not spec.endswith(".json"):
            raise ConfigError(f"model.hf_config = {spec!r} is neither a file nor a bundled "
                              f"config.json{did_you_mean(spec, bundled)}; bundled: "
                              f"{', '.join(sorted(bundled))}")
        text, label = read_text(path, what="HuggingFace config.json"), str(path)
    doc = parse_json(text, f"HuggingFace config.json {label}")
    if not isinstance(doc, dict):
        raise ConfigError(f"HuggingFace config.json {label} must be a JSON object, got "
                          f"{type(doc).__name__}")
    return doc, label


def unmodelled_warning(source: str, unmodelled: list[str]) -> str | None:
    """The one warning line listing the keys of a ``config.json`` that a family's
    :meth:`~WorkloadFamily.from_hf` did not model, or None."""
    if not unmodelled:
        return None
    return (f"{source}: {len(unmodelled)} config.json key(s) not modelled by ddlsim, ignored: "
            + ", ".join(unmodelled))


def expand_hf_config(section: dict, base_dir: Any = None) -> dict:
    """A model section ``{hf_config: PATH or NAME, …}`` as its family's fields.

    ``PATH`` is relative to ``base_dir`` (the run config's folder); ``NAME`` is a bundled
    file (``llama-2-70b``, ``meta-llama-3-8b``, …). The family is the one registered for the
    file's ``model_type``; the section's other keys override the file's values. Keys of the
    file that ddlsim does not model are reported once, in one
    :class:`~ddlsim.errors.DDLSimWarning` line.
    """
    import warnings
    from pathlib import PurePath

    from ..errors import DDLSimWarning

    doc, label = _hf_document(section["hf_config"], base_dir)
    model_type = doc.get("model_type") or ("gpt2" if "n_embd" in doc else "llama")
    fields, unmodelled = hf_family(model_type, label).from_hf(doc, label)
    rest = {k: v for k, v in section.items() if k != "hf_config"}
    if rest.get("architecture", fields["architecture"]) != fields["architecture"]:
        raise ConfigError(f"model.architecture = {rest['architecture']!r} contradicts {label}, "
                          f"whose model_type {model_type!r} is read as architecture "
                          f"{fields['architecture']!r}; remove the architecture key")
    path = PurePath(label)
    name = (str(doc.get("_name_or_path") or "")
            or (path.parent.name if path.name == "config.json" else path.stem) or "custom")
    out = {"name": PurePath(name).name, **fields,
           "source": f"HuggingFace config.json: {section['hf_config']}", **rest}
    from .models.hf_keys import SUPERSEDED_BY
    # a key whose model field the section sets is the section's to decide, not the file's
    unmodelled = [m for m in unmodelled if not any(
        m.startswith(f"{key}=") and field in rest for key, field in SUPERSEDED_BY.items())]
    line = unmodelled_warning(label, unmodelled)
    if line:
        warnings.warn(line, DDLSimWarning, stacklevel=2)
    return out


def check_plan_fields(cfg: "RunConfig", family: WorkloadFamily) -> None:
    """Raise ``ValueError`` naming every plan field outside ``family.plan_fields`` that ``cfg``
    sets to a value other than its default (the family would not read it).

    Every field of ``cfg.parallel`` and ``cfg.train`` is judged, except those a run config must
    give (they have no default to leave them at).
    """
    if family.plan_fields is None:
        return
    read, bad = set(family.plan_fields), []
    for section in ("parallel", "train"):
        sec = getattr(cfg, section)
        for name, field in type(sec).model_fields.items():
            path = f"{section}.{name}"
            if path in read or field.is_required():
                continue
            value = getattr(sec, name)
            if value != field.get_default(call_default_factory=True):
                bad.append(f"{path} = {value!r}")
    if bad:
        raise ValueError(f"{'; '.join(bad)}: the {family.architecture} family does not use "
                         f"{'this option' if len(bad) == 1 else 'these options'} (its trace "
                         f"would be the same without {'it' if len(bad) == 1 else 'them'}); "
                         f"remove {'it' if len(bad) == 1 else 'them'} "
                         f"(docs/workloads/{family.architecture}.md says what the family models)")
