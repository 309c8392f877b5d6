"""The registered readers: each turns one path into a :class:`~.common.Draft`."""

from __future__ import annotations

from pathlib import Path

from ..textio import read_text
from .common import Draft, register_importer

__all__ = ["megatron", "modelzoo", "deepspeed", "torchtitan", "hf"]


def _megatron_known() -> list[str]:
    from .megatron_flags import megatron_flag_names
    return megatron_flag_names()


@register_importer("megatron", "Megatron-LM", _megatron_known)
def megatron(path: Path) -> Draft:
    """A ``pretrain_gpt.py`` launch script or command line (a text file)."""
    from .megatron import read_megatron
    return read_megatron(read_text(path, what="Megatron-LM script"), str(path))


@register_importer("modelzoo", "Megatron-MoE-ModelZoo launcher", _megatron_known,
                   options=("repo", "env"))
def modelzoo(path: Path, repo: Path | None = None, env: tuple[str, ...] = ()) -> Draft:
    """A Megatron-MoE-ModelZoo run script (with ``repo``, its checkout) or model YAML, with
    the launcher's variables ``env`` (``NAME=value``)."""
    from .modelzoo import read_modelzoo
    return read_modelzoo(path, repo, env)


def _deepspeed_known() -> list[str]:
    from .deepspeed import deepspeed_key_names
    return deepspeed_key_names()


@register_importer("deepspeed", "DeepSpeed config", _deepspeed_known)
def deepspeed(path: Path) -> Draft:
    """A DeepSpeed ``ds_config.json``."""
    from ..documents import parse_json
    from .deepspeed import read_deepspeed
    doc = parse_json(read_text(path, what="DeepSpeed config"), str(path))
    return read_deepspeed(doc, str(path))


def _torchtitan_known() -> list[str]:
    from .torchtitan import torchtitan_key_names
    return torchtitan_key_names()


@register_importer("torchtitan", "torchtitan TOML", _torchtitan_known)
def torchtitan(path: Path) -> Draft:
    """A torchtitan train config (TOML)."""
    from .torchtitan import read_torchtitan
    return read_torchtitan(read_text(path, what="torchtitan TOML"), str(path))


@register_importer("hf", "Hugging Face config.json", lambda: ["every key of config.json"])
def hf(path: Path) -> Draft:
    """A Hugging Face model folder (its ``config.json``) or the file itself: the model
    section, expanded as ``model: {hf_config: …}`` is."""
    from ..workloads.registry import expand_hf_config
    from ..errors import ConfigError

    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path}: a Hugging Face model folder holds config.json; this one "
                          "does not")
    draft = Draft(str(path))
    fields = expand_hf_config({"hf_config": str(file.absolute())})
    fields["source"] = f"HuggingFace config.json: {file}"
    draft.fields.update({f"model.{k}": v for k, v in fields.items() if v is not None})
    draft.note(str(file), f"the model section ({fields.get('architecture')} family), read as "
                          "model: {hf_config: …} reads it")
    return draft
