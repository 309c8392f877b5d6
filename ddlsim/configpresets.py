"""Model and system presets as users name them: a model by its Hugging Face repository or
its downloaded folder, and
``--set SECTION.preset=NAME`` or ``--set SECTION=NAME`` (``system.preset=dgx-h100``,
``model=llama-3-70b``, also swept by ``sweep --set-range``) replacing a section by a preset
while keeping what the config gave beside its own preset, as ``model: llama-3-70b`` does in
a config file."""

from __future__ import annotations

from typing import Any

from .documents import DocumentError, parse_yaml
from .errors import ConfigError

__all__ = ["preset_alias", "preset_overrides", "preset_section", "hf_folder", "not_bundled"]


def preset_alias(section: str, name: str) -> str:
    """A model named as its Hugging Face repository (``meta-llama/Meta-Llama-3-70B``,
    ``Mistral-7B-v0.1``): the model preset of that name in lower case, without the
    organisation and a ``-hf`` suffix, when there is one; a chat or instruction-tuned
    release (``Llama-3.1-8B-Instruct``, ``Llama-2-7b-chat-hf``) is its base model's shape
    (their config.json files differ in token ids only); else ``name``."""
    if section != "model" or not isinstance(name, str) or ("/" not in name
                                                           and name == name.lower()):
        return name
    from .presets import list_presets
    known = list_presets("model")["model"]
    short = name.rsplit("/", 1)[-1].lower().removesuffix("-hf")
    tuned = short.removesuffix("-instruct").removesuffix("-chat")   # the base model's shape
    return next((n for n in (name, short, tuned) if n in known), name)


#: A preset of each section, for messages (``ddlsim presets SECTION`` lists them all).
_EXAMPLE = {"model": "llama-3-70b", "system": "dgx-h100", "parallel": "dp-only",
            "train": "gpt3-paper"}


def preset_section(path: str) -> str | None:
    """The section whose preset ``path`` names: ``SECTION.preset`` or ``SECTION`` alone (a
    whole section given by a preset name, as ``model: llama-3-70b`` in a config file), for a
    section with presets (:data:`ddlsim.presets.SECTIONS`); else None."""
    from .presets import SECTIONS

    keys = [k.strip() for k in str(path).split(".")]
    if keys[0] in SECTIONS and (len(keys) == 1 or (len(keys) == 2 and keys[1] == "preset")):
        return keys[0]
    return None


def preset_overrides(data: dict, overrides: Any, sections: Any) -> tuple[dict, list[str]]:
    """Apply ``--set SECTION.preset=NAME`` and ``--set SECTION=NAME`` overrides
    (``system.preset=dgx-h100``, ``model=llama-3-70b``).

    The section becomes that preset with the keys the config gave beside its own ``preset``
    (``nodes: 128``); the other overrides are returned to be applied after it.

    Parameters
    ----------
    data : dict
        The run config's sections as read (before presets are resolved).
    overrides : list of str
        ``path=value`` items, as ``--set`` takes them.
    sections : collection of str
        The section names.

    Returns
    -------
    (dict, list of str)
        The sections with presets swapped in, and the overrides left.

    Raises
    ------
    ConfigError
        For a section written out in full (no preset: its keys would override every value of
        the preset), two different presets for one section, a value YAML cannot read, or
        ``SECTION=VALUE`` whose value is not a preset name (a section is set field by field:
        ``SECTION.KEY=VALUE``).
    """
    chosen: dict[str, tuple[str, Any]] = {}
    rest = []
    for item in overrides or ():
        path, sep, raw = str(item).partition("=")
        section = preset_section(path)
        if not (sep and section in sections):
            rest.append(item)
            continue
        try:
            value = parse_yaml(raw, f"override {item!r}")
        except DocumentError as exc:
            raise ConfigError(f"{exc}; quote a string value that YAML cannot read") from None
        if "." not in path and not isinstance(value, str):
            raise ConfigError(f"override {item!r}: the path {path.strip()!r} must be a section "
                              f"and one or more keys joined by dots, or a section alone given "
                              f"the name of a {section} preset (e.g. --set {section}="
                              f"{_EXAMPLE[section]}); got {value!r}")
        if section in chosen and chosen[section][1] != value:
            raise ConfigError(f"overrides {chosen[section][0]!r} and {item!r} name two "
                              f"{section} presets; give one")
        chosen[section] = (item, value)
    data = dict(data)
    for name, (item, value) in chosen.items():
        given = data.get(name)
        source = _SOURCE.get(name, ("preset",))
        if isinstance(given, dict) and given and not any(k in given for k in source):
            raise ConfigError(
                f"override {item!r}: the config's {name} section is written out in full (no "
                f"preset), so its keys ({', '.join(map(str, given))}) would override every "
                f"value of the preset; write it as `{name}: {{preset: NAME, …}}` with only "
                f"the keys to keep (e.g. nodes), or set those keys with --set")
        kept = ({k: v for k, v in given.items() if k not in source and k != "name"}
                if isinstance(given, dict) else {})
        data[name] = {"preset": value, **kept}
    return data, rest


#: The keys of a section that say where its values come from (a preset; for a model also a
#: Hugging Face ``config.json``): a preset given by ``--set`` replaces them, and the
#: section's ``name`` (the old source's label), and keeps the others, as a section's own
#: preset keeps the keys beside it.
_SOURCE = {"model": ("preset", "hf_config")}


def hf_folder(section: dict, base_dir: Any = None) -> dict:
    """A model section whose ``hf_config`` names a Hugging Face model folder (as downloaded
    from the hub) with its ``config.json`` named instead; other sections unchanged."""
    from pathlib import Path

    spec = section.get("hf_config")
    if not isinstance(spec, str) or not spec:
        return section
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if path.is_dir() and (path / "config.json").is_file():
        return {**section, "hf_config": str(Path(spec) / "config.json")}
    return section


def _not_modelled() -> dict:
    """``data/hf/not_modelled.yaml``: reasons by model_type, and the names users type."""
    from .workloads.registry import read_presets
    return read_presets("ddlsim.data.hf:not_modelled.yaml")


def not_bundled(name: Any = None, model_type: Any = None) -> str | None:
    """Why ddlsim bundles no preset of the published model ``name`` (as users type it:
    ``gemma-2-9b``, ``google/gemma-2-9b-it``) or reads no ``config.json`` of ``model_type``: a
    feature that changes a step and is not modelled, named (``data/hf/not_modelled.yaml``);
    None for any other name or type."""
    table = _not_modelled()
    reasons, names = table.get("model_types", {}), table.get("presets", {})
    if isinstance(name, str):
        short = name.rsplit("/", 1)[-1].lower().removesuffix("-hf")
        for tuned in (short, *(short.removesuffix(s) for s in ("-instruct", "-it", "-chat"))):
            if tuned in names:
                entry = names[tuned]
                return (f"{entry['repository']} is not bundled: "
                        f"{reasons[entry['model_type']]}")
    if isinstance(model_type, str) and model_type in reasons:
        return f"model_type {model_type!r} is not read: {reasons[model_type]}"
    return None
