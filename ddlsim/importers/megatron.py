"""Megatron-LM launch arguments (a ``pretrain_gpt.py`` command line or script) → ddlsim fields.

Flag names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (and, for the
2021 flags ``--checkpoint-activations`` and ``--DDP-impl``, ``megatron/arguments.py`` of
6985e58, the SC'21 code). Every argument is mapped, declared without effect on one
iteration, accepted as not modelled, or refused by name (:mod:`.common`); the flags' tables
are :mod:`.megatron_flags`'s.
"""

from __future__ import annotations

from .common import Draft
from .megatron_flags import (CHOICE_NOTES, CHOICES, LIST_FLAGS, MEGATRON_FLAGS, MODEL_FLAGS,
                             NO_EFFECT, NOT_MODELLED, PER_LAYER_CHOICES, SWITCHES, VALUE_FLAGS)
from .megatron_fsdp import FSDP_FLAGS, megatron_fsdp_flags
from .megatron_notes import KNOWN_REFUSED, LAUNCHER, batch_schedule
from .shell import is_unset, read_commands

__all__ = ["read_megatron", "read_megatron_command"]


def _groups(words: list[str]) -> list[tuple[str, list[str]]]:
    """``[--flag, v, v, --flag2, …]`` as ``(flag, values)`` (``--flag=v`` too)."""
    out: list[tuple[str, list[str]]] = []
    for w in words:
        if w.startswith("--") and len(w) > 2 and not w[2].isdigit():
            name, eq, value = w[2:].partition("=")
            out.append((name, [value] if eq else []))
        elif out:
            out[-1][1].append(w)
        else:
            out.append(("", [w]))
    return out


def read_megatron(text: str, where: str) -> Draft:
    """The ddlsim fields a Megatron-LM command line or launch script sets.

    Parameters
    ----------
    text : str
        A ``pretrain_gpt.py`` launch script, its command line, or its arguments alone.
    where : str
        The source's name in notes and messages (its path).

    Returns
    -------
    Draft
        The fields (dotted paths, SI units as the run config takes them) and the fate of
        every argument; refused arguments are in ``Draft.refused``, not raised here.
    """
    variants = read_commands(text, where)
    drafts = [read_megatron_command(v.command, where) for v in variants]
    first = drafts[0]
    for variant, draft in zip(variants[1:], drafts[1:]):
        changed = sorted(k for k in first.fields.keys() | draft.fields.keys()
                         if first.fields.get(k, "unset") != draft.fields.get(k, "unset"))
        if changed or sorted(draft.refused) != sorted(first.refused):
            what = ", ".join(f"{k} ({first.fields.get(k, 'unset')!r} or "
                             f"{draft.fields.get(k, 'unset')!r})" for k in changed[:4])
            first.refuse("if " + " and ".join(f"{c} is true" for c, t in variant.assumed if t),
                         "only running the script decides this condition (an environment "
                         f"variable, $1 or a file), and it changes {what or 'what is refused'}"
                         "; set what it tests in the script, or give the command line it runs")
            return first
    for cond in dict.fromkeys(c for v in variants for c, _ in v.assumed):
        first.note(f"if {cond}", "either way the same fields (only running the script decides "
                                 "it; the way where it is false is written)")
    return first


def read_megatron_command(cmd, where: str, name: str | None = None) -> Draft:
    """The draft of one command (one way through a script): its launcher, flags and model;
    ``name`` names the model (default: the file's name)."""
    draft = Draft(where)
    own = where.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0] or "megatron"
    draft.set("model.name", name or own,
              "the model's name: " + ("the launcher's MODEL" if name else "the file's"))
    _launcher(draft, cmd.launcher)
    model: dict[str, list[str]] = {}
    fsdp = []
    for flag, values in _groups(cmd.args):
        if flag in FSDP_FLAGS:      # read together, after the rest (.megatron_fsdp)
            fsdp.append((flag, values))
        else:
            _one(draft, flag, values, model)
    megatron_fsdp_flags(draft, fsdp)
    from .megatron_model import model_fields
    model_fields(draft, model, cmd.script)
    return draft


#: launchers whose ``--nnodes`` defaults to one node: torchrun, i.e. ``python -m
#: torch.distributed.run`` (torch/distributed/run.py: ``--nnodes`` default ``"1:1"``), and the
#: deprecated ``torch.distributed.launch`` it wraps (``--nnodes`` default 1)
ONE_NODE_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _launcher(draft: Draft, words: list[str]) -> None:
    launcher = next((w for w in words if w.rsplit("/", 1)[-1] in ONE_NODE_LAUNCHERS), None)
    if launcher and not any(f in ("nnodes", "num_nodes") for f, _ in _groups(words)):
        draft.set("system.nodes", 1, f"{launcher} without --nnodes: one node, its default")
    for flag, values in _groups(words):
        arg = f"--{flag} {' '.join(values)}".strip()
        if not flag:
            draft.note(" ".join(values), "the launcher")
        elif flag in LAUNCHER and LAUNCHER[flag] is None:
            draft.note(arg, "no effect: the launcher's rendezvous")
        elif flag in LAUNCHER:
            _value(draft, arg, LAUNCHER[flag], values, int)
        else:
            draft.refuse(arg, "a launcher flag ddlsim does not read; it reads --nproc_per_node "
                              "and --nnodes, and knows the rendezvous flags")


def _value(draft: Draft, arg: str, path: str, values: list[str], kind: type) -> None:
    if len(values) != 1:
        draft.refuse(arg, f"expects one value, got {len(values)}")
    elif is_unset(values[0]):
        draft.refuse(arg, f"its value {values[0]} is a variable the script does not set; "
                          "set it in the script, or give the field with --set")
    else:
        try:
            draft.set(path, kind(values[0]), arg)
        except ValueError:
            draft.refuse(arg, f"expects {'a whole number' if kind is int else 'a number'}, "
                              f"got {values[0]!r}")


def _list(draft: Draft, arg: str, path: str, values: list[str]) -> None:
    """Set ``path`` to the list ``values`` (a flag with ``nargs``); the names are checked
    when the imported config is validated, as ``predict`` checks them."""
    unset = [v for v in values if is_unset(v)]
    if not values:
        draft.refuse(arg, "expects one value or more, got none")
    elif unset:
        draft.refuse(arg, f"its value {unset[0]} is a variable the script does not set; "
                          "set it in the script, or give the field with --set")
    else:
        draft.set(path, list(values), arg)


def _one(draft: Draft, flag: str, values: list[str], model: dict[str, list[str]]) -> None:
    arg = f"--{flag} {' '.join(values)}".strip()
    if flag in VALUE_FLAGS:
        path, kind = VALUE_FLAGS[flag]
        _value(draft, arg, path, values, kind)
    elif flag in LIST_FLAGS:
        _list(draft, arg, LIST_FLAGS[flag], values)
    elif flag in SWITCHES:
        if values:
            draft.refuse(arg, f"--{flag} takes no value")
        else:
            draft.set(*SWITCHES[flag], arg)
    elif flag in CHOICES:
        picked = CHOICES[flag].get(values[0] if len(values) == 1 else " ".join(values))
        if picked is None:
            per_layer = " (one for every layer)" if flag in PER_LAYER_CHOICES else ""
            draft.refuse(arg, f"ddlsim models --{flag} {' or '.join(CHOICES[flag])}"
                              f"{per_layer} only")
        for path, value in picked or ():
            draft.set(path, value, arg)
        if picked == []:
            draft.note(arg, CHOICE_NOTES[arg.removeprefix("--")])
    elif flag in MODEL_FLAGS:
        model[flag] = values
    elif flag in NO_EFFECT:
        draft.note(arg, f"no effect on one iteration: {NO_EFFECT[flag]}")
    elif flag == "no-masked-softmax-fusion" and not values:    # decided by the stack
        draft.pending["no_masked_softmax_fusion"] = arg
    elif flag == "step-batch-size-schedule":
        batch_schedule(draft, arg, values, NOT_MODELLED[flag])
    elif flag in KNOWN_REFUSED:
        draft.refuse(arg, KNOWN_REFUSED[flag])
    elif flag in NOT_MODELLED:
        draft.unmodelled_arg(arg, NOT_MODELLED[flag])
    else:
        from ..errors import did_you_mean
        draft.refuse(arg or " ".join(values), "not a Megatron-LM flag ddlsim reads"
                     + did_you_mean(flag, MEGATRON_FLAGS) if flag else
                     "a word that belongs to no --flag")

