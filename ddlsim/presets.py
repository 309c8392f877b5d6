"""Named presets for each config section, shipped as YAML in ``ddlsim/data`` with sources.

Model presets come from the workload families (:mod:`ddlsim.workloads.registry`): each family
names its presets file; ``list_presets("model")`` is their union, in registration order."""

from __future__ import annotations

from functools import cache
from importlib import resources

from .errors import ConfigError, did_you_mean

__all__ = ["get_preset", "list_presets", "model_preset_families", "SECTIONS"]

SECTIONS = {"model": "models.yaml", "system": "systems.yaml", "parallel": "parallel.yaml",
            "train": "train.yaml"}


def model_preset_families() -> dict[str, str]:
    """Model preset name → the architecture of the family that provides it."""
    from .workloads.registry import families

    out: dict[str, str] = {}
    for arch, family in families().items():
        for name in family.presets():
            out.setdefault(name, arch)
    return out


def _model_preset(name: str) -> dict | None:
    """The model preset ``name`` of the first family (in :func:`families` order) that has
    it, as :func:`_load`'s table would give it, or None."""
    from .workloads.registry import iter_families

    for arch, _ in iter_families():
        preset = _family_presets(arch).get(name)
        if preset is not None:
            return preset
    return None


@cache
def _family_presets(architecture: str) -> dict[str, dict]:
    """One family's presets, read once (as :func:`_load` reads the whole table once)."""
    from .workloads.registry import get_family

    return get_family(architecture).presets()


@cache
def _load(section: str) -> dict[str, dict]:
    from .documents import load_bundled_yaml

    if section == "model":
        from .workloads.registry import families
        table: dict[str, dict] = {}
        for family in families().values():
            for name, preset in family.presets().items():
                table.setdefault(name, preset)
        return table
    text = resources.files("ddlsim.data").joinpath(SECTIONS[section]).read_text()
    return load_bundled_yaml(text) or {}


def list_presets(section: str | None = None) -> dict[str, dict[str, dict]]:
    """All presets, by section (or one section's)."""
    sections = [section] if section else list(SECTIONS)
    return {s: _load(s) for s in sections}


def get_preset(section: str, name: str) -> dict:
    """The raw mapping of one preset; raises :class:`ConfigError` listing the known names."""
    if section not in SECTIONS:
        raise ConfigError(f"unknown section {section!r}{did_you_mean(section, SECTIONS)}; "
                          f"allowed: {', '.join(SECTIONS)}")
    if section == "model":  # the first family that has it, importing no more families than needed
        found = _model_preset(name)
        if found is not None:
            return found
    table = _load(section)
    if name not in table and section == "model":
        from .configpresets import not_bundled
        why = not_bundled(name)
        if why:
            raise ConfigError(f"model preset {name!r}: {why}; give a config.json of a model "
                              f"ddlsim reads instead (see `ddlsim presets model`)")
    if name not in table:
        spelled = _spelled(name, table)
        if spelled is not None:
            return table[spelled]
        raise ConfigError(f"{section} preset {name!r} does not exist{did_you_mean(name, table)}; "
                          f"known {section} presets: "
                          f"{', '.join(sorted(table))} (see `ddlsim presets`)")
    return table[name]


def _canonical(name: str) -> str:
    """``name`` without case, hyphens, underscores and spaces: how users spell one model
    differently (``Llama-3.1-8B``, ``llama3.1-8b``; ``gpt-3-175b`` for ``gpt3-175b``)."""
    return "".join(c for c in name.lower() if c not in "-_ ")


def _spelled(name: str, table: dict) -> str | None:
    """The preset of ``table`` that ``name`` spells otherwise (:func:`_canonical`): the one
    that does, or the first by name of several that are one model under other names (equal
    but for their ``source``); None when none does or they differ (then the error lists
    them)."""
    key = _canonical(name)
    hits = sorted(n for n in table if _canonical(n) == key)
    shapes = {repr(sorted((k, v) for k, v in table[n].items() if k != "source")) for n in hits}
    return hits[0] if hits and len(shapes) == 1 else None
