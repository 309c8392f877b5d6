"""The values of a swept or searched field, checked by the field's own validator.

``ddlsim sweep --set-range`` and ``ddlsim search``'s axes name a config field by its path
(``parallel.tensor_model_parallel_size``) and give it several values. Each value is checked
here against the pydantic type of that field, the same validator a config file goes through
(booleans are not counts, ``2.5`` is not a tensor-parallel size, a list is not a scalar), so a
value that no combination could make valid is refused up front, naming the path, the value and
the validator's reason. Rules that tie several fields together stay with the whole config.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import ConfigError

__all__ = ["check_field_values", "field_adapter"]

#: What a checked value may be replaced by: the validator's result when it is one of these
#: (``"2"`` → 2); any other result (a model, an enum) leaves the value as given.
_PLAIN = (bool, int, float, str, type(None))


@functools.lru_cache(maxsize=256)
def field_adapter(path: str) -> TypeAdapter | None:
    """The validator of a list of values of the config field at ``path``
    (``section.key[.key…]``; one pass in pydantic's core for the whole list), or None when
    the path leaves the typed sections (the ``model`` section, whose type is its family's) or
    names a section itself (``system.device``, which a preset name may stand for) or no
    field."""
    from .config import RunConfig

    model: Any = RunConfig
    keys = path.split(".")
    for i, key in enumerate(keys):
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields or key == "model" and i == 0:
            return None
        info = fields[key]
        if i == len(keys) - 1:
            if _has_model(info.annotation):  # a section: preset names resolve before it
                return None
            item = Annotated[info.annotation, *info.metadata] if info.metadata else \
                info.annotation
            return TypeAdapter(list[item])
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return None


def _has_model(tp: Any) -> bool:
    """Whether the type ``tp`` is, or holds, a pydantic model (a section that may also be
    named by a preset, resolved before validation)."""
    from typing import get_args

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return True
    return any(_has_model(a) for a in get_args(tp))


def check_field_values(path: str, values: Sequence[Any], where: str, *,
                       keep_text: bool = True) -> list[Any]:
    """``values`` after the validator of the field at ``path``; the first value it refuses
    raises :class:`ConfigError` naming ``where``, the value and the reason.

    Parameters
    ----------
    path : a config path such as ``parallel.tensor_model_parallel_size``.
    values : the values given for it.
    where : how the message names them (``--set-range 'PATH=…'``, ``search.axes.PATH``).
    keep_text : keep a value given as text as it was typed (``"10 Gb/s"`` stays, so tables
        show what was typed) instead of the validator's result (1.25e9).

    Returns
    -------
    list
        The values, each replaced by the validator's result when that is a plain scalar
        (``2.0`` → 2) and the value is not text kept by ``keep_text``.
    """
    adapter = field_adapter(path)
    if adapter is None:
        return list(values)
    values = list(values)
    try:
        checked = adapter.validate_python(values)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]["loc"][0] if errors and errors[0]["loc"] else 0
        reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in errors
                           if e["loc"][:1] == (first,)) or "refused"
        value = values[first] if isinstance(first, int) and first < len(values) else values
        raise ConfigError(f"{where}: the value {_short(value)} is not valid for {path}: "
                          f"{reason}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a value is not valid for {path}: {exc}") from None
    out = []
    for value, result in zip(values, checked):
        keep = keep_text and isinstance(value, str)
        out.append(result if isinstance(result, _PLAIN) and not keep else value)
    return out


def _short(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[:most] + "…"
