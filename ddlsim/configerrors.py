"""A run config's validation errors as clauses that name the field, the value and what is
allowed: pydantic's errors, with a union's branches told once and "did you mean …" for
misspelt keys and choices (:func:`ddlsim.configload.format_validation_error` joins them).
"""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel

from .errors import did_you_mean

__all__ = ["shown", "union_errors", "clause"]


def shown(value: Any, width: int = 60) -> str:
    """``value`` as an error message quotes it: its ``repr``, cut to ``width`` characters (a
    huge integer by its bit length)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= width else text[:width - 5] + " …" + text[-3:]


#: a location part that names a branch of a union: pydantic reports each branch's failure
#: under the branch's name (``str``, ``function-after[…]``, a model class), not a field's
_FUNCTION_BRANCH = re.compile(r"^function-(after|before|wrap|plain)\[.*\]$")
_SCALAR_BRANCHES = frozenset({"str", "int", "float", "bool"})


def _model_names() -> frozenset[str]:
    """Names of ddlsim's pydantic models (the branch names of a union of models)."""
    seen, todo = set(), list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("ddlsim"):
            seen.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(seen)


def _branches(err: dict) -> list[int]:
    """Positions in ``err``'s location that name union branches (a scalar branch only as the
    last part of a type error: a user's key may be called ``str``)."""
    loc = err["loc"]
    if not loc:   # a model's own validator (a search grid's rule probes): no walk of the models
        return []
    models = _model_names()
    return [j for j, p in enumerate(loc) if isinstance(p, str) and (
        _FUNCTION_BRANCH.match(p) or p in models
        or (p in _SCALAR_BRANCHES and j == len(loc) - 1 and err["type"].endswith("_type")))]


def union_errors(errors: list[dict]) -> list[dict]:
    """The errors of a value that matched no branch of a union, told once: a branch that
    failed only on the value's type (``Input should be a valid string`` for a mapping) is
    dropped when another branch got further, and branch names leave the location."""
    tags = [_branches(err) for err in errors]
    deeper = {err["loc"][:t[0]] for err, t in zip(errors, tags)
              if t and len(err["loc"]) > t[0] + 1}
    typed = {err["loc"][:t[0]] for err, t in zip(errors, tags)   # a branch took the type
             if t and not err["type"].endswith("_type")}
    out = []
    for err, t in zip(errors, tags):
        if not t:
            out.append(err)
            continue
        here = err["loc"][:t[0]]
        if len(err["loc"]) == t[0] + 1 and (here in deeper or (
                err["type"].endswith("_type") and here in typed)):
            continue                                  # the other branch says more
        loc = tuple(p for j, p in enumerate(err["loc"]) if j not in t)
        same = next((o for o in out if o["loc"] == loc and o["type"].endswith("_type")), None)
        if same is not None and err["type"].endswith("_type"):   # no branch took the type
            same["msg"] += ", or " + err["msg"].removeprefix("Input should be ")
            continue
        out.append({**err, "loc": loc})
    return out


def clause(err: dict, where: str, model: Any) -> str:
    """One pydantic error ``err`` of section ``where`` (whose schema is ``model``) as a clause
    naming the field, the value and what is allowed, with "did you mean …" for a misspelt key
    or choice and the importers' hint for another framework's key."""
    loc = ".".join(str(x) for x in err["loc"] if x != "__root__")
    field = f"{where}.{loc}" if loc else where
    if field == "config":  # a cross-section rule: its message names the fields
        return err["msg"].removeprefix("Value error, ")
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        parent = ".".join([where, *[str(x) for x in err["loc"][:-1]]])
        allowed = _allowed_keys(model, err["loc"][:-1])
        key = err["loc"][-1]
        from .importers.hints import foreign_hint
        hint = foreign_hint(key)
        return (f"unknown key {key!r} in {parent}"
                + (f"; {hint}" if hint else did_you_mean(key, allowed))
                + (f"; allowed keys: {', '.join(allowed)}" if allowed else ""))
    if err["type"] == "literal_error":
        from .importers.hints import value_hint
        choices = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        hint = value_hint(field, err.get("input"))
        msg += f"; {hint}" if hint else did_you_mean(err.get("input"), choices)
    given = err.get("input")
    quiet = isinstance(given, dict) or err["type"] == "missing" or "got " in msg
    got = "" if quiet else f" (got {shown(given)})"
    return f"{field}: {msg}{got}"


def _allowed_keys(model: Any, loc: tuple) -> list[str]:
    for part in loc:
        model = _model_of(model)
        if model is None:
            return []
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = field.annotation
    model = _model_of(model)
    return [] if model is None else sorted(model.model_fields)


def _model_of(annotation: Any) -> Any:
    """The pydantic model an annotation holds (the model branch of ``str | Model | None``)."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in typing.get_args(annotation):
        if hasattr(arg, "model_fields"):
            return arg
    return None
