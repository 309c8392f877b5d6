"""What every importer shares: a :class:`Draft` of ddlsim fields read from one file, with what
became of each of the file's arguments, and the merge of drafts into one run config.

An importer maps each argument it reads to one of four outcomes, and says which:

* **mapped** — it sets ddlsim fields (``--tensor-model-parallel-size 8`` →
  ``parallel.tensor_model_parallel_size: 8``);
* **no effect** — it cannot change the time of one iteration (a data path, a learning rate, a
  logging interval), with the reason;
* **not modelled** — it changes the time a little and ddlsim does not model it (gradient
  clipping's norm); accepted, and reported as a warning and in the written YAML;
* **refused** — anything else: the import stops, naming every such argument, unless the user
  passes ``--ignore NAME`` for it (then it is listed as ignored at the user's request).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError, DDLSimWarning

__all__ = ["Draft", "merge_drafts", "nested", "refuse_unknown", "Importer", "register_importer"]


@dataclass
class Draft:
    """The ddlsim fields one source sets (dotted path → value) and the fate of its arguments.

    ``notes`` lists ``(argument, outcome)`` in the order read; ``unmodelled`` the arguments
    accepted whose effect ddlsim does not model; ``refused`` ``(argument, reason)`` pairs;
    ``pending`` values that need the whole config (DeepSpeed's gradient accumulation steps).
    """

    source: str
    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)
    unmodelled: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    pending: dict[str, Any] = field(default_factory=dict)

    def set(self, path: str, value: Any, argument: str) -> None:
        """Set ``path`` to ``value`` because of ``argument``; two arguments of one source that
        set one field to different values are refused."""
        if path in self.fields and self.fields[path] != value:
            self.refused.append((argument, f"sets {path} = {value!r}, but an earlier argument "
                                           f"set it to {self.fields[path]!r}"))
            return
        self.fields[path] = value
        self.notes.append((argument, f"{path}: {value!r}"))

    def note(self, argument: str, outcome: str) -> None:
        """Record an argument that sets no field, with what became of it."""
        self.notes.append((argument, outcome))

    def unmodelled_arg(self, argument: str, what: str) -> None:
        """Accept ``argument`` whose effect ddlsim does not model, saying what it leaves out."""
        self.unmodelled.append(f"{argument} ({what})")
        self.notes.append((argument, f"not modelled: {what}"))

    def refuse(self, argument: str, reason: str) -> None:
        """Refuse ``argument`` (the import stops unless the user ignores it)."""
        self.refused.append((argument, reason))


def refuse_unknown(draft: Draft, ignore: set[str], known: list[str], kind: str,
                   reader: str) -> None:
    """Raise one :class:`ConfigError` naming every refused argument of ``draft`` that
    ``ignore`` does not name (those are noted as ignored); ``known`` lists what ``kind``
    arguments ddlsim maps: the message counts them and names the command that lists them
    (``ddlsim import --arguments READER``; an unknown name already has its close matches).
    Warn once about the arguments not modelled."""
    left = []
    for argument, reason in draft.refused:
        name = argument.split()[0].split("=")[0]
        if name in ignore or name.rstrip(":").lstrip("-") in ignore:
            draft.note(argument, f"ignored at the user's request (--ignore): {reason}")
        else:
            left.append(f"{argument}: {reason}")
    if left:
        raise ConfigError(
            f"{draft.source}: {len(left)} {kind} argument(s) ddlsim cannot map: "
            + "; ".join(left) + f". Pass --ignore NAME to import without one (it is then "
            f"listed in the YAML as ignored). ddlsim reads {len(known)} {kind} arguments: "
            f"`ddlsim import --arguments {reader}` lists them")
    if draft.unmodelled:
        warnings.warn(f"{draft.source}: accepted but not modelled by ddlsim: "
                      + "; ".join(draft.unmodelled), DDLSimWarning, stacklevel=2)


def merge_drafts(drafts: list[Draft]) -> dict[str, Any]:
    """The fields of all ``drafts`` in one mapping (dotted path → value); two sources that
    set one field to different values are refused, naming both."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for d in drafts:
        for path, value in d.fields.items():
            if path in out and out[path] != value:
                raise ConfigError(f"{path}: {origin[path]} gives {out[path]!r} and {d.source} "
                                  f"gives {value!r}; make them agree or import one of them")
            out[path], origin[path] = value, d.source
    return out


def nested(fields: dict[str, Any]) -> dict[str, Any]:
    """Dotted paths as nested mappings, sections in run-config order."""
    out: dict[str, Any] = {k: {} for k in ("model", "parallel", "train", "system")}
    for path, value in fields.items():
        node = out
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    first = ("name", "architecture", "preset")
    for k, section in out.items():   # the keys that say what a section is come first
        if isinstance(section, dict):
            out[k] = {**{f: section[f] for f in first if f in section}, **section}
    return {k: v for k, v in out.items() if v != {}}


# ------------------------------------------------------------------ the readers' registry
class Importer(NamedTuple):
    """A reader: ``read(path, **options)`` → :class:`Draft`; ``what`` names its input,
    ``options`` the import options it takes (``repo``, ``env``) (the registry lives here,
    beside :class:`Draft`, so that the readers import no package module that imports them)."""

    name: str
    what: str
    read: Callable[..., Draft]
    known: Callable[[], list[str]]
    options: tuple[str, ...] = ()


_IMPORTERS: dict[str, Importer] = {}


def register_importer(name: str, what: str, known: Callable[[], list[str]],
                      options: tuple[str, ...] = ()):
    """Register ``read(path, **options) -> Draft`` under ``name`` (what ``--from`` takes);
    ``options`` names the import options it is passed."""
    def wrap(read: Callable[..., Draft]) -> Callable[..., Draft]:
        _IMPORTERS[name] = Importer(name, what, read, known, options)
        return read
    return wrap
