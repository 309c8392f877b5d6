"""Named presets for each config section, shipped as YAML in ``ddlsim/data`` with sources."""

from __future__ import annotations

from functools import cache
from importlib import resources

from .errors import ConfigError, did_you_mean

__all__ = ["get_preset", "list_presets", "SECTIONS"]

SECTIONS = {"model": "models.yaml", "system": "systems.yaml", "parallel": "parallel.yaml",
            "train": "train.yaml"}


@cache
def _load(section: str) -> dict[str, dict]:
    import yaml

    text = resources.files("ddlsim.data").joinpath(SECTIONS[section]).read_text()
    return yaml.safe_load(text) or {}


def list_presets(section: str | None = None) -> dict[str, dict[str, dict]]:
    """All presets, by section (or one section's)."""
    sections = [section] if section else list(SECTIONS)
    return {s: _load(s) for s in sections}


def get_preset(section: str, name: str) -> dict:
    """The raw mapping of one preset; raises :class:`ConfigError` listing the known names."""
    if section not in SECTIONS:
        raise ConfigError(f"unknown section {section!r}{did_you_mean(section, SECTIONS)}; "
                          f"allowed: {', '.join(SECTIONS)}")
    table = _load(section)
    if name not in table:
        raise ConfigError(f"{section} preset {name!r} does not exist{did_you_mean(name, table)}; "
                          f"known {section} presets: "
                          f"{', '.join(sorted(table))} (see `ddlsim presets`)")
    return table[name]
