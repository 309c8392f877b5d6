"""bash's conditions ``[ … ]`` and ``[[ … ]]`` in a launch script, decided where the script
fixes their operands, and left undecided (``None``) where the machine that runs it would.

Decided: ``-n``, ``-z``, a lone word, ``=``, ``==``, ``!=``, the integer comparisons ``-eq``,
``-ne``, ``-lt``, ``-le``, ``-gt``, ``-ge``, ``!``, and ``&&``/``||`` between tests (bash's
``test`` builtin, bash(1) "CONDITIONAL EXPRESSIONS"). Undecided: an operand the script does not
set (``$1``, an environment variable), a file test (``-f``, ``-d``, ``-e``: the files of the
machine that runs it), a regular expression ``=~``, or any other command used as a condition.
"""

from __future__ import annotations

import operator
import shlex

from .shell import is_unset

__all__ = ["decide"]

_INT_OPS = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
            "-gt": operator.gt, "-ge": operator.ge}
_STR_OPS = {"=": operator.eq, "==": operator.eq, "!=": operator.ne}


def decide(condition: str) -> bool | None:
    """Whether the expanded ``condition`` (the words between ``if`` and ``then``) holds, or
    None when running the script would decide it."""
    try:
        words = shlex.split(condition)
    except ValueError:
        return None
    return _or(words)


def _or(words: list[str]) -> bool | None:
    """``a || b && c`` as bash reads it: ``&&`` and ``||`` of equal precedence, left to
    right."""
    value: bool | None = None
    op = None
    for part, nxt in _chain(words):
        this = _negated(part)
        if op is None:
            value = this
        elif op == "&&":
            value = False if value is False or this is False else (
                None if value is None or this is None else True)
        else:
            value = True if value is True or this is True else (
                None if value is None or this is None else False)
        op = nxt
    return value


def _chain(words: list[str]) -> list[tuple[list[str], str | None]]:
    """The tests between ``&&``/``||`` (outside brackets' ``&&``, which ``[[`` also takes)."""
    out, part = [], []
    for w in words:
        if w in ("&&", "||") and not _open(part):
            out.append((part, w))
            part = []
        else:
            part.append(w)
    out.append((part, None))
    return out


def _open(part: list[str]) -> bool:
    """Whether ``part`` is inside an unclosed ``[[`` (where ``&&`` joins two tests)."""
    return part.count("[[") > part.count("]]")


def _negated(words: list[str]) -> bool | None:
    if words[:1] == ["!"]:
        inner = _negated(words[1:])
        return None if inner is None else not inner
    if len(words) >= 2 and (words[0], words[-1]) in (("[", "]"), ("[[", "]]")):
        inner = words[1:-1]
        if "&&" in inner or "||" in inner:
            return _or(inner)
        return _test(inner)
    return None     # another command as the condition: its exit status decides


def _test(words: list[str]) -> bool | None:
    """One test of ``[ … ]``."""
    if words[:1] == ["!"]:
        inner = _test(words[1:])
        return None if inner is None else not inner
    if any(is_unset(w) for w in words):
        return None
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-n", "-z"):
        return (words[1] != "") == (words[0] == "-n")
    if len(words) == 3 and words[1] in _STR_OPS:
        return _STR_OPS[words[1]](words[0], words[2])
    if len(words) == 3 and words[1] in _INT_OPS:
        try:
            return _INT_OPS[words[1]](int(words[0]), int(words[2]))
        except ValueError:
            return None
    return None     # a file test, =~, or a form not read here
