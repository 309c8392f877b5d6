"""Reading and validating a run config: file → mapping → sections → :class:`RunConfig`.

Every problem becomes one :class:`~ddlsim.errors.ConfigError` paragraph that names the file,
the field, the value and what is allowed; every broken section is reported at once, with
"did you mean …" for misspelt keys, section names, preset names and choices. Merely unusual
values are accepted with a :class:`~ddlsim.errors.DDLSimWarning`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from . import config as C
from .configerrors import clause, shown, union_errors
from .configpresets import hf_folder, preset_alias, preset_overrides
from .errors import ConfigError, did_you_mean

__all__ = ["load_config", "build_config", "apply_overrides", "resolve_section",
           "format_validation_error", "read_document"]

_SECTIONS = {"model": C.ModelBase, "parallel": C.ParallelConfig, "train": C.TrainConfig,
             "system": C.SystemConfig}
_REQUIRED = ("model", "train", "system")


def format_validation_error(exc: ValidationError, where: str, root: Any = None) -> str:
    """One clause per problem, naming the field, the value and what is allowed. ``root`` is the
    model that ``where`` names (default: the config section of that name)."""
    model = (root or _SECTIONS.get(where.split(".")[-1])
             or (C.RunConfig if where == "config" else None))
    return "; ".join(clause(err, where, model) for err in union_errors(exc.errors()))


def resolve_section(name: str, value: Any, base_dir: Any = None, expand: bool = True) -> dict:
    """A section as a plain mapping: a preset name, a mapping, or ``{preset: …, overrides}``.

    A model section with ``hf_config`` (a HuggingFace ``config.json``: a path relative to
    ``base_dir``, or a bundled name) becomes its family's fields
    (:func:`ddlsim.workloads.registry.expand_hf_config`) unless ``expand`` is False.

    Raises :class:`ConfigError` for anything else (a list, a number, null), naming the
    section and what is allowed.
    """
    data = _resolved(name, value)
    if name == "model" and "hf_config" in data and expand:
        from .workloads.registry import expand_hf_config
        return expand_hf_config(hf_folder(data, base_dir), base_dir)
    return data


def _resolved(name: str, value: Any) -> dict:
    from .presets import get_preset  # local import: presets import config

    if isinstance(value, str):
        return _named(name, value, copy.deepcopy(get_preset(name, preset_alias(name, value))))
    if isinstance(value, BaseModel):
        return value.model_dump()
    if not isinstance(value, dict):
        raise ConfigError(f"section {name!r} must be a mapping of its fields or the name of a "
                          f"{name} preset (see `ddlsim presets {name}`); got "
                          f"{_kind(value)}{'' if value is None else ' ' + shown(value)}")
    value = dict(value)
    base = value.pop("preset", None)
    if base is None:
        return value
    if not isinstance(base, str):
        raise ConfigError(f"{name}.preset must be the name of a {name} preset; got "
                          f"{_kind(base)} {shown(base)}")
    merged = _named(name, base, copy.deepcopy(get_preset(name, preset_alias(name, base))))
    _deep_update(merged, value)
    return merged


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", dict: "a mapping", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _named(section: str, preset: str, data: dict) -> dict:
    """Models and systems carry their preset's name unless they set one."""
    if section in ("model", "system"):
        data.setdefault("name", preset)
    return data


def _deep_update(base: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


#: Why a ``search:`` section is refused outside ``ddlsim search`` (not ignored).
_SEARCH_ONLY = ("section 'search' (plan-search axes, constraints, objective) is read only by "
                "ddlsim search (ddlsim.search); run ddlsim search on this file, or remove the "
                "section to use the config alone")


def build_config(data: dict, overrides: list[str] | tuple[str, ...] = (),
                 base_dir: Any = None) -> C.RunConfig:
    """Validate a run config given as a mapping (sections may be preset names).

    Every section is checked, and every problem found is listed in one message. ``base_dir``
    is the folder that relative paths in the config (``model.hf_config``) start from.

    Raises
    ------
    ConfigError
        Naming each field, the value and what is allowed.
    """
    parsed = validated_sections(data, overrides, base_dir)
    try:
        cfg = C.RunConfig(**parsed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "config")) from None
    from .limits import warn_unusual
    warn_unusual(cfg)
    return cfg


def _missing_section(name: str) -> str:
    """The problem of a run config without the required section ``name``, with what would
    fill it: a preset (``ddlsim presets``), or the train section's required keys."""
    if name == "train":
        keys = [k for k, f in _SECTIONS[name].model_fields.items() if f.is_required()]
        keys.append("seq_length")   # required of a sequence model (RunConfig._train_from_model)
        return (f"the config has no 'train' section; it needs {', '.join(keys)} (e.g. "
                f"train: {{{', '.join(f'{k}: …' for k in keys)}}}; seq_length, the tokens "
                "per sample, is 1 when left out for a model whose sample is one image, "
                "volume or row of features)")
    return (f"the config has no {name!r} section; give a preset (`{name}: NAME`, `ddlsim "
            f"presets {name}`) or the section's keys")


def validated_sections(data: dict, overrides: list[str] | tuple[str, ...] = (),
                       base_dir: Any = None, names: tuple[str, ...] | None = None) -> dict:
    """Each section of a run config (or those of ``names``) validated on its own, with the
    ``--set`` overrides applied: what :func:`build_config` checks before the sections are
    checked together (a plan that does not suit the model, …).

    Raises
    ------
    ConfigError
        Naming each field, the value and what is allowed, every problem in one message.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a run config must be a mapping with sections model, parallel, train, "
                          f"system; got {_kind(data)}")
    problems = _unknown_sections([k for k in data if k not in _SECTIONS])
    problems += [_missing_section(k) for k in _REQUIRED if k not in data]
    data, overrides = preset_overrides(data, overrides, _SECTIONS)
    sections = {}
    for name in (k for k in _SECTIONS if k in data):
        try:
            sections[name] = resolve_section(name, data[name], base_dir, expand=False)
        except ConfigError as exc:
            problems.append(str(exc))
    sections = apply_overrides(sections, overrides)
    model = sections.get("model")
    if isinstance(model, dict) and "hf_config" in model:  # after --set: it may name one
        from .workloads.registry import expand_hf_config
        try:
            sections["model"] = expand_hf_config(hf_folder(model, base_dir), base_dir)
        except ConfigError as exc:
            problems.append(str(exc))
            del sections["model"]
    parsed = {}
    for name, value in sections.items():
        if names is not None and name not in names:
            continue
        try:
            parsed[name] = _validate_section(name, value)
        except ValidationError as exc:
            problems.append(format_validation_error(exc, name, _root(name, value)))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError(_joined(problems))
    return parsed


def _unknown_sections(keys: list) -> list[str]:
    """Why each of ``keys`` is not a section: a misspelling, or another framework's config
    (the keys of one framework told in one clause)."""
    from .importers.hints import foreign_group, foreign_hint
    out, groups = [], {}
    for key in keys:
        group = foreign_group(key)
        if key == "search":
            out.append(_SEARCH_ONLY)
        elif group:
            groups.setdefault(group, []).append(key)
        elif home := _home_section(key):
            out.append(f"unknown section {key!r}: it is a key of section {home} "
                       f"({home}.{key})")
        elif hint := foreign_hint(key):   # a word for a field, at the top
            out.append(f"unknown section {key!r}; {hint}")
        else:
            out.append(f"unknown section {key!r}{did_you_mean(key, _SECTIONS)}")
    for (kind, advice), names in groups.items():
        listed = ", ".join(map(repr, names))
        many = len(names) > 1
        close = "" if many else did_you_mean(names[0], _SECTIONS)
        out.append(f"unknown section{'s' if many else ''} {listed}{close}: "
                   f"{f'they are {kind}s' if many else f'it is a {kind}'}; {advice}")
    return out


def _home_section(key: str) -> str | None:
    """The section with a field named ``key`` (every model family's schema counting for
    ``model``), or None."""
    from .workloads.registry import iter_families
    for name, schema in _SECTIONS.items():
        if key in schema.model_fields:
            return name
    if any(key in family.schema.model_fields for _, family in iter_families()):
        return "model"
    return None


def _validate_section(name: str, value: Any) -> BaseModel:
    if name == "model":  # the schema of the family that model.architecture names
        from .workloads.registry import validate_model
        return validate_model(value)
    return _SECTIONS[name].model_validate(value)


def _root(name: str, value: Any) -> Any:
    """The pydantic model a section's errors refer to (the model family's schema)."""
    if name != "model" or not isinstance(value, dict):
        return None
    from .workloads.registry import ARCHITECTURE_DEFAULT, get_family
    try:
        return get_family(value.get("architecture", ARCHITECTURE_DEFAULT)).schema
    except ConfigError:
        return None


def _joined(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in
                                                       enumerate(problems, 1))


#: Override values read without the YAML parser, each the value ``parse_yaml`` gives it (~70
#: us a parse; a search builds its base config from nine JSON-written overrides): ``null``,
#: ``true``, ``false``, a decimal integer of at most 30 digits without leading zeros (YAML
#: 1.1 reads ``010`` as octal: left to the parser), and a double-quoted word of letters,
#: digits and ``_.-``. ``tests/test_config_overrides.py`` checks each kind against the parser.
_PLAIN_SCALARS: dict[str, Any] = {"null": None, "true": True, "false": False}
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,29})\Z")
_PLAIN_WORD = re.compile(r'"[A-Za-z0-9_.-]*"\Z')
_NOT_PLAIN = object()


def _plain_value(raw: str) -> Any:
    """The value of override text ``raw`` where it is one of :data:`_PLAIN_SCALARS`' kinds,
    else :data:`_NOT_PLAIN` (for the YAML parser)."""
    if raw in _PLAIN_SCALARS:
        return _PLAIN_SCALARS[raw]
    if _PLAIN_INT.match(raw):
        return int(raw)
    if _PLAIN_WORD.match(raw):
        return raw[1:-1]
    return _NOT_PLAIN


def apply_overrides(sections: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML: ``4``, ``true``, ``[1,2]``).

    Raises :class:`ConfigError` for an item without ``=``, an empty or unknown path, a path
    through a value that is not a mapping, or a value that is not valid YAML.
    """
    from .documents import DocumentError, parse_yaml

    out = copy.deepcopy(sections)
    for item in overrides or ():
        path, sep, raw = str(item).partition("=")
        keys = [k.strip() for k in path.split(".")]
        example = "e.g. --set parallel.tensor_model_parallel_size=4"
        if not sep:
            raise ConfigError(f"override {item!r} must look like section.key=value, {example}")
        if len(keys) < 2 or not all(keys):
            raise ConfigError(f"override {item!r}: the path {path!r} must be a section and one "
                              f"or more keys joined by dots, {example}")
        if keys[0] not in _SECTIONS:
            raise ConfigError(f"override {item!r}: unknown section {keys[0]!r}"
                              f"{did_you_mean(keys[0], _SECTIONS)}; allowed: "
                              f"{', '.join(_SECTIONS)}")
        value = _plain_value(raw)
        if value is _NOT_PLAIN:
            try:
                value = parse_yaml(raw, f"override {item!r}")
            except DocumentError as exc:
                raise ConfigError(f"{exc}; quote a string value that YAML cannot read") from None
        node = out.setdefault(keys[0], {})
        for depth, k in enumerate(keys[1:-1], 1):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(keys[:depth + 1])} is "
                                  f"{_kind(node)}, not a mapping, so it has no key "
                                  f"{keys[depth + 1]!r}")
        node[keys[-1]] = value
    return out


def read_document(path: str | Path) -> dict:
    """Read a YAML or JSON run config into a mapping, with errors that name the file.

    The file is read by :func:`ddlsim.textio.read_text` (size cap, UTF-8, no directories,
    FIFOs or devices) and parsed by :mod:`ddlsim.documents` (no duplicate keys, bounded
    nesting and alias expansion, no NaN/Infinity in JSON).
    """
    from .documents import DocumentError, parse_document
    from .textio import InputFileError, read_text

    try:
        text = read_text(path, what="config file")
    except InputFileError as exc:  # a ConfigError, as every problem with a config is
        raise DocumentError(f"{exc}{_preset_named(path)}") from None
    data = parse_document(text, str(path), Path(path).suffix.lower() == ".json")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a run config must be a mapping with sections model, "
                          f"parallel, train, system; the file holds {_kind(data)}")
    return data


def _preset_named(path: str | Path) -> str:
    """``"; it is a … preset, …"`` when the missing config file ``path`` is the name of a
    model or system preset (a user naming the model for the config), else ``""``."""
    if Path(path).exists() or Path(path).suffix.lower() in (".yaml", ".yml", ".json"):
        return ""
    from .configpresets import preset_alias
    from .presets import get_preset
    name = str(path)
    examples = {"model": f"model: {name}, train: {{micro_batch_size: 1, global_batch_size: "
                         "64, seq_length: 4096}, system: {preset: dgx-h100, nodes: 8}",
                "system": f"system: {{preset: {name}, nodes: N}} beside model and train "
                          "sections"}
    for section, example in examples.items():
        try:
            get_preset(section, preset_alias(section, name))
        except ConfigError:
            continue
        return (f"; {name!r} is a {section} preset: a run config names it ({example}), or "
                f"give it to an example config with --set {section}={name}")
    return ""


def load_config(source: str | Path | dict,
                overrides: list[str] | tuple[str, ...] = (), *,
                model: str | Path | None = None) -> C.RunConfig:
    """Load and validate a run config from a YAML/JSON path or a mapping.

    ``model``, a HuggingFace ``config.json`` (path, or bundled name), replaces the model
    section (the CLI's ``--model``); relative paths inside a config file (``hf_config``)
    start from the file's folder.

    One plan, so beyond :func:`build_config`'s checks (which a search or a sweep over
    ``parallel.zero_stage`` applies to each of its plans) a ``zero3_*`` field the config sets
    is refused when the plan is not ZeRO-3 (:func:`ddlsim.software.check_zero3_fields`).

    Raises
    ------
    ConfigError
        One paragraph naming the file, the field, the value and what is allowed
        (:class:`ddlsim.documents.DocumentError` for a file that cannot be read or parsed).
    """
    if not isinstance(source, (str, Path, dict)):
        raise ConfigError(f"a run config is a path to a YAML/JSON file or a mapping; got "
                          f"{_kind(source)} {shown(source)}")
    data = source if isinstance(source, dict) else read_document(source)
    base_dir = None if isinstance(source, dict) else Path(source).parent
    if model is not None:
        data = {**data, "model": {"hf_config": str(Path(model).absolute())
                                  if Path(model).exists() else str(model)}}
    from .software import check_zero3_fields
    try:
        cfg = build_config(data, overrides, base_dir)
        check_zero3_fields(cfg.software, cfg.parallel.zero_stage)
        return cfg
    except ConfigError as exc:
        if isinstance(source, (str, Path)):
            raise type(exc)(f"{source}: {exc}") from None
        raise
