"""Model and system presets as users name them: a model by its Hugging Face repository or
its downloaded folder, and
``--set SECTION.preset=NAME`` (``system.preset=dgx-h100``, also swept by ``sweep --set-range``)
replacing a section by a preset while keeping what the config gave beside its own preset."""

from __future__ import annotations

from typing import Any

from .documents import DocumentError, parse_yaml
from .errors import ConfigError

__all__ = ["preset_alias", "preset_overrides", "hf_folder"]


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


def preset_overrides(data: dict, overrides: Any, sections: Any) -> tuple[dict, list[str]]:
    """Apply ``--set SECTION.preset=NAME`` overrides (``system.preset=dgx-h100``).

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
        the preset), two different presets for one section, or a value YAML cannot read.
    """
    chosen: dict[str, tuple[str, Any]] = {}
    rest = []
    for item in overrides or ():
        path, sep, raw = str(item).partition("=")
        keys = [k.strip() for k in path.split(".")]
        if not (sep and len(keys) == 2 and keys[0] in sections and keys[1] == "preset"):
            rest.append(item)
            continue
        try:
            value = parse_yaml(raw, f"override {item!r}")
        except DocumentError as exc:
            raise ConfigError(f"{exc}; quote a string value that YAML cannot read") from None
        if keys[0] in chosen and chosen[keys[0]][1] != value:
            raise ConfigError(f"overrides {chosen[keys[0]][0]!r} and {item!r} name two "
                              f"{keys[0]} presets; give one")
        chosen[keys[0]] = (item, value)
    data = dict(data)
    for name, (item, value) in chosen.items():
        given = data.get(name)
        if isinstance(given, dict) and "preset" not in given and given:
            raise ConfigError(
                f"override {item!r}: the config's {name} section is written out in full (no "
                f"preset), so its keys ({', '.join(map(str, given))}) would override every "
                f"value of the preset; write it as `{name}: {{preset: NAME, …}}` with only "
                f"the keys to keep (e.g. nodes), or set those keys with --set")
        kept = {k: v for k, v in given.items() if k != "preset"} if isinstance(given, dict) else {}
        data[name] = {"preset": value, **kept}
    return data, rest


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
