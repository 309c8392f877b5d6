"""Reading a launch script or command line as bash would split it, without running anything.

Handled: line continuations, comments, ``NAME=value`` and ``export NAME=value`` assignments,
``NAME+=…``, bash arrays ``NAME=( … )`` and their ``${NAME[@]}`` (split into words) and
``"${NAME[@]}"`` (element by element), ``$NAME``, ``${NAME}``, ``${NAME:-default}`` (``${1:-x}``
too), ``VAR=x command`` prefixes, here-documents (skipped), and integer ``$(( … ))``
arithmetic. A variable the script does not set (``$1``, an environment variable, a command
substitution ``$( … )``) becomes the marker ``<unset:NAME>``: an importer that needs that
argument's value refuses it by name, one that does not need it (a data path) leaves it alone.

``if``/``elif``/``else``/``fi`` are followed: a condition on the script's own values is
decided (:mod:`.shell_conditions`), one that only running the script decides is followed both
ways (:func:`read_commands` returns each way). Loops (``for``, ``while``, ``case``) are
refused.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from collections.abc import Iterator
from typing import NamedTuple

from ..errors import ConfigError

__all__ = ["Command", "Variant", "read_command", "read_commands", "read_script", "UNSET",
           "is_unset"]

#: how an unresolved variable reads after expansion
UNSET = "<unset:{}>"

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_]\w*)(\+?)=(.*)$",
                     re.S)
#: ``"${NAME[@]}"``: an array's elements, each one word
_QUOTED_ARRAY = re.compile(r'"\$\{([A-Za-z_]\w*)\[@\]\}"')
#: a here-document's start (``cat <<EOF``, ``<<-'EOF'``), not a here-string (``<<<``)
_HEREDOC = re.compile(r"(?<!<)<<-?\s*['\"]?([A-Za-z_]\w*)['\"]?")
_VAR = re.compile(r"\$\(\((.*?)\)\)|\$\{([A-Za-z_]\w*)\[@\]\}"
                  r"|\$\{([A-Za-z_]\w*|[0-9]+)(:-([^}]*))?\}"
                  r"|\$([A-Za-z_]\w*|[0-9@*#?])|\$\(([^)]*)\)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


#: words that start bash's compound commands: past ``if``/``elif``/``else``/``fi``/``then``,
#: which :func:`_run` follows, a script with them is refused, not guessed
_CONTROL = frozenset({"if", "elif", "else", "fi", "for", "while", "until", "case", "esac",
                      "do", "done", "then", "select", "{", "}"})


class Command(NamedTuple):
    """A training command: the launcher's words, the script run, and the script's arguments."""

    launcher: list[str]
    script: str | None
    args: list[str]


def is_unset(word: str) -> bool:
    """Whether ``word`` holds a variable the script does not set."""
    return "<unset:" in word


def _arith(expr: str) -> str | None:
    """The value of an integer ``$(( … ))`` expression, or None."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(expr)
    try:
        return str(ev(ast.parse(expr.strip(), mode="eval")))
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
        return None


def _expand(text: str, env: dict[str, str]) -> str:
    """``text`` with the variables of ``env`` substituted (unset ones as markers). An array
    keeps its elements whole in ``"${NAME[@]}"`` and is split at blanks in ``${NAME[@]}``,
    as bash splits an unquoted expansion into words."""
    text = _QUOTED_ARRAY.sub(lambda m: env.get(m.group(1), UNSET.format(m.group(1))), text)

    def sub(m: re.Match) -> str:
        arith, array, braced, has_default, default, plain, command = m.groups()
        if arith is not None:
            value = _arith(re.sub(r"[A-Za-z_]\w*", lambda n: env.get(n.group(0), n.group(0)),
                                  _expand(arith, env)))
            return value if value is not None else UNSET.format("$((" + arith.strip() + "))")
        if command is not None:
            return UNSET.format("$(" + command.strip() + ")")
        name = array or braced or plain
        if array and name in env:
            return " ".join(_split(env[name], "an array"))
        if name in env:
            return env[name]
        if has_default is not None:
            return _expand(default, env)
        return UNSET.format(name)
    return _VAR.sub(sub, text)


def _statements(text: str) -> list[str]:
    """The script's statements: comments dropped, continuations joined, a multi-line array
    one statement, a here-document's body skipped (it is data, not commands), and the parts
    of ``if …; then …; fi`` written on one line apart."""
    out: list[str] = []
    pending, heredoc = "", None
    for raw in text.splitlines():
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        line = _strip_comment(raw).rstrip()
        more = line.endswith("\\")
        line = line[:-1] if more else line
        pending = f"{pending} {line}" if pending else line
        m = _HEREDOC.search(line)
        heredoc = m.group(1) if m else None
        head = _ASSIGN.match(pending.strip())
        if more or (head and head.group(3).lstrip().startswith("(")
                    and ")" not in head.group(3)):
            continue            # a continued line, or an array that goes on
        out += _parts(pending.strip())
        pending = ""
    out += _parts(pending.strip())
    return out


def _unquoted(text: str, brackets: bool = True) -> Iterator[tuple[int, str, int]]:
    """``(index, character, bracket depth)`` of each character of ``text`` outside single
    and double quotes, the quotes themselves left out; with ``brackets`` the ``(``/``{`` and
    ``)``/``}`` that open and close ``$( )``, ``${ }`` and arrays are left out too and set
    the depth."""
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif brackets and ch in "({":
            depth += 1
        elif brackets and ch in ")}":
            depth -= 1
        else:
            yield i, ch, depth


def _parts(stmt: str) -> list[str]:
    """``stmt`` split at its top-level ``;`` (outside quotes and brackets), with the
    keywords ``then``/``else``/``do`` apart from the command that follows them."""
    parts, start = [], 0
    for i, ch, depth in _unquoted(stmt):
        if ch == ";" and depth == 0:
            parts.append(stmt[start:i])
            start = i + 1
    parts.append(stmt[start:])
    out = []
    for part in (p.strip() for p in parts):
        head, _, rest = part.partition(" ")
        if head in ("then", "else", "do") and rest.strip():
            out += [head, rest.strip()]
        elif part:
            out.append(part)
    return out


def _strip_comment(line: str) -> str:
    """``line`` without its comment (a ``#`` that starts a word outside quotes)."""
    for i, ch, _ in _unquoted(line, brackets=False):
        if ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split {text[:80]!r} as a shell would ({exc})") from None


class Variant(NamedTuple):
    """One way the script can run: its command, and the conditions the script leaves to the
    machine that runs it (``$1``, an environment variable, a file), each as taken or not."""

    command: Command
    assumed: tuple[tuple[str, bool], ...]


#: undecided conditions explored both ways on one path (2**6 paths at most)
MAX_UNDECIDED = 6


class _Undecided(Exception):
    """Raised on reaching a condition that neither the script nor an assumption decides."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


def read_commands(text: str, where: str) -> list[Variant]:
    """Every way the script ``text`` can run (``where`` names it in errors): a condition the
    script decides is followed as bash would; one it leaves undecided (on an environment
    variable, ``$1`` or a file) is followed both ways, not taken first; a way that ``exit``s
    before a training command is dropped. A script that loops is refused.

    Returns
    -------
    list of Variant
        The training command of each way, the one with every undecided condition not taken
        first.
    """
    stmts = _statements(text)
    done: list[Variant] = []
    todo: list[dict[int, bool]] = [{}]
    while todo:
        assume = todo.pop(0)
        try:
            commands = _run(stmts, where, assume)
        except _Undecided as u:
            if len(assume) >= MAX_UNDECIDED:
                raise ConfigError(f"{where}: more than {MAX_UNDECIDED} conditions the script "
                                  "leaves to the machine that runs it (environment variables, "
                                  "$1, files); give the command line it runs") from None
            todo += [{**assume, u.index: False}, {**assume, u.index: True}]
            continue
        if commands is not None:
            assumed = tuple((_condition(stmts[i]), v) for i, v in sorted(assume.items()))
            done.append(Variant(_pick(commands, where), assumed))
    done.sort(key=lambda v: sum(taken for _, taken in v.assumed))
    if not done:
        raise ConfigError(f"{where}: every way through the script exits before a training "
                          "command")
    return done


def read_command(text: str, where: str) -> Command:
    """The training command in a script or command line ``text`` (``where`` names it in
    errors): the statement that runs a ``pretrain_*.py`` script (else the last that runs a
    ``.py`` file), or ``text`` itself when it is only arguments (``--num-layers 24 …``).
    A script whose undecided conditions change the command is refused, naming them."""
    variants = read_commands(text, where)
    differ = [v for v in variants if v.command != variants[0].command]
    if differ:
        raise ConfigError(f"{where}: the script passes other arguments when "
                          + " and ".join(f"{c!r} is {'true' if t else 'false'}"
                                         for c, t in differ[0].assumed)
                          + ", which only running it decides; give the command line it runs")
    return variants[0].command


def _condition(stmt: str) -> str:
    """The condition of an ``if``/``elif`` statement, as written."""
    cond = stmt.split(None, 1)[1] if " " in stmt else ""
    return cond[:-5].rstrip() if cond.endswith(" then") else cond


def read_script(text: str, where: str, env: dict[str, str]) -> list[list[str]]:
    """Every command of a script whose conditions it decides itself, each with its ``VAR=x``
    prefixes, run with the variables ``env`` (updated with what the script assigns), as for a
    launcher that passes its variables on to another script (:mod:`.modelzoo`).

    Raises
    ------
    ConfigError
        When a condition depends on running the script (an environment variable not in
        ``env``, ``$1``, a file), naming it; or when the script loops.
    """
    stmts = _statements(text)
    try:
        return _run(stmts, where, {}, env, keep_prefixes=True) or []
    except _Undecided as u:
        raise ConfigError(f"{where}: {_condition(stmts[u.index])!r} depends on running the "
                          "script (an environment variable, $1 or a file); give its value "
                          "(--env NAME=value)") from None


def _run(stmts: list[str], where: str, assume: dict[int, bool],
         env: dict[str, str] | None = None,
         keep_prefixes: bool = False) -> list[list[str]] | None:
    """The commands one way through ``stmts`` runs (None when it exits before a training
    command), from the variables ``env`` (none given: empty; updated in place), with their
    ``VAR=x`` prefixes when ``keep_prefixes``; raises :class:`_Undecided` at a condition
    neither the script nor ``assume`` decides."""
    from .shell_conditions import decide

    env = {} if env is None else env
    commands: list[list[str]] = []
    frames: list[list[bool]] = []     # per open if: [active, a branch was taken, parent on]
    for i, stmt in enumerate(stmts):
        word = stmt.split()[0]
        on = all(f[0] for f in frames)
        if word in ("if", "elif"):
            if word == "if":
                frames.append([False, False, on])
            elif not frames:
                raise ConfigError(f"{where}: 'elif' without 'if'")
            frame = frames[-1]
            if not frame[2] or frame[1]:
                frame[0] = False
                continue
            value = decide(_expand(_condition(stmt), env))
            value = assume.get(i, value) if value is None else value
            if value is None:
                raise _Undecided(i)
            frame[0] = frame[1] = value
            continue
        if word in ("else", "fi"):
            if not frames:
                raise ConfigError(f"{where}: {word!r} without 'if'")
            if word == "else":
                frames[-1][0] = not frames[-1][1]
            else:
                frames.pop()
            continue
        if word == "then" or not on:
            continue
        if word in _CONTROL or word.startswith(("[", "function")):
            raise ConfigError(f"{where}: the script loops or branches by {stmt[:40]!r}, so "
                              "which arguments it passes depends on running it; give the "
                              "command line it runs (or the script without the loop)")
        if word == "exit":      # a way that ends before its training command is dropped
            return commands if any(_scripts(c) for c in commands) else None
        if not _assign(stmt, env, where):
            words = _split(_expand(stmt, env), where)
            while words and _ASSIGN.match(words[0]) and not keep_prefixes:  # VAR=x torchrun
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def _assign(stmt: str, env: dict[str, str], where: str) -> bool:
    """Apply ``stmt`` to ``env`` if it is an assignment (``NAME=…``, ``NAME+=…``, an array),
    and say whether it was; ``NAME=x cmd …`` is a command."""
    m = _ASSIGN.match(stmt)
    if not m or m.start(1) + _first_word_end(stmt[m.start(1):]) < len(stmt):
        return False
    name, append, value = m.group(1), m.group(2), m.group(3).strip()
    if value.startswith("("):
        words = _split(_expand(value[1:value.rfind(")")], env), where)
        joined = " ".join(shlex.quote(w) for w in words)
        env[name] = f"{env[name]} {joined}".strip() if append and name in env else joined
    else:
        joined = " ".join(_split(_expand(value, env), where))
        env[name] = env.get(name, "") + joined if append else joined
    return True


def _first_word_end(stmt: str) -> int:
    """Where the statement's first word ends (outside quotes, ``$( )``, ``${ }``, arrays)."""
    for i, ch, depth in _unquoted(stmt):
        if ch.isspace() and depth == 0:
            return i if stmt[i:].strip() else len(stmt)
    return len(stmt)


#: commands that print their words rather than run them
_PRINTS = frozenset({"echo", "printf"})


def _scripts(words: list[str]) -> list[int]:
    """Where ``words`` name a Python script it runs (none in ``echo … pretrain_gpt.py``)."""
    if not words or words[0] in _PRINTS:
        return []
    return [j for j, w in enumerate(words) if w.endswith(".py")]


def _pick(commands: list[list[str]], where: str) -> Command:
    """The training command among ``commands``: the one that runs ``pretrain_*.py`` (else the
    last that runs a ``.py`` file), or the only one when it is arguments alone."""
    if not commands:
        raise ConfigError(f"{where}: no command found (a script that runs pretrain_gpt.py, or "
                          "its arguments)")
    scripts = [(i, j) for i, words in enumerate(commands) for j in _scripts(words)]
    chosen = ([s for s in scripts if commands[s[0]][s[1]].rsplit("/", 1)[-1]
               .startswith("pretrain")] or scripts)
    if not chosen:
        if len(commands) == 1 and commands[0][0].startswith("--"):
            return Command([], None, commands[0])
        shown = "; ".join(" ".join(c)[:60] for c in commands[-3:])
        raise ConfigError(f"{where}: no command runs a Python training script (e.g. "
                          f"pretrain_gpt.py); the last it runs: {shown}. Give the script "
                          "that runs pretrain_gpt.py, its command line, or only its arguments")
    i, j = chosen[-1]
    words = commands[i]
    return Command(words[:j], words[j], words[j + 1:])
