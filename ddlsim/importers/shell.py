"""Reading a launch script or command line as bash would split it, without running anything.

Handled: line continuations, comments, ``NAME=value`` and ``export NAME=value`` assignments,
bash arrays ``NAME=( … )`` and their ``${NAME[@]}``, ``$NAME``, ``${NAME}``,
``${NAME:-default}``, and integer ``$(( … ))`` arithmetic. A variable the script does not set
(``$1``, an environment variable, a command substitution ``$( … )``) becomes the marker
``<unset:NAME>``: an importer that needs that argument's value refuses it by name, one
that does not need it (a data path) leaves it alone.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from typing import NamedTuple

from ..errors import ConfigError

__all__ = ["Command", "read_command", "UNSET", "is_unset"]

#: how an unresolved variable reads after expansion
UNSET = "<unset:{}>"

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_]\w*)=(.*)$", re.S)
_VAR = re.compile(r"\$\(\((.*?)\)\)|\$\{([A-Za-z_]\w*)\[@\]\}|\$\{([A-Za-z_]\w*)(:-([^}]*))?\}"
                  r"|\$([A-Za-z_]\w*|[0-9@*#?])|\$\(([^)]*)\)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


#: words that start bash's compound commands: a script with them is refused, not guessed
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
    """``text`` with the variables of ``env`` substituted (unset ones as markers)."""
    def sub(m: re.Match) -> str:
        arith, array, braced, has_default, default, plain, command = m.groups()
        if arith is not None:
            value = _arith(re.sub(r"[A-Za-z_]\w*", lambda n: env.get(n.group(0), n.group(0)),
                                  _expand(arith, env)))
            return value if value is not None else UNSET.format("$((" + arith.strip() + "))")
        if command is not None:
            return UNSET.format("$(" + command.strip() + ")")
        name = array or braced or plain
        if name in env:
            return env[name]
        if has_default is not None:
            return _expand(default, env)
        return UNSET.format(name)
    return _VAR.sub(sub, text)


def _statements(text: str) -> list[str]:
    """The script's statements: comments dropped, continuations joined, a multi-line array
    one statement."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        more = line.endswith("\\")
        line = line[:-1] if more else line
        pending = f"{pending} {line}" if pending else line
        head = _ASSIGN.match(pending.strip())
        if more or (head and head.group(2).lstrip().startswith("(")
                    and ")" not in head.group(2)):
            continue            # a continued line, or an array that goes on
        if pending.strip():
            out.append(pending.strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def _strip_comment(line: str) -> str:
    """``line`` without its comment (a ``#`` that starts a word outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split {text[:80]!r} as a shell would ({exc})") from None


def read_command(text: str, where: str) -> Command:
    """The training command in a script or command line ``text`` (``where`` names it in
    errors): the statement that runs a ``pretrain_*.py`` script (else the last that runs a
    ``.py`` file), or ``text`` itself when it is only arguments (``--num-layers 24 …``)."""
    env: dict[str, str] = {}
    commands = []
    for stmt in _statements(text):
        m = _ASSIGN.match(stmt)
        if m and " " not in stmt.split("=", 1)[0].strip().split()[-1]:
            value = m.group(2).strip()
            if value.startswith("("):
                words = _split(_expand(value[1:value.rfind(")")], env), where)
                env[m.group(1)] = " ".join(shlex.quote(w) for w in words)
            else:
                env[m.group(1)] = " ".join(_split(_expand(value, env), where))
            continue
        if stmt.split()[0] in _CONTROL or stmt.split()[0].startswith(("[", "function")):
            raise ConfigError(f"{where}: the script branches or loops ({stmt[:40]!r}), so "
                              "which arguments it passes depends on running it; give the "
                              "command line it runs (or the script without the branches)")
        words = _split(_expand(stmt, env), where)
        while words and _ASSIGN.match(words[0]):   # VAR=x torchrun …
            words = words[1:]
        if words:
            commands.append(words)
    if not commands:
        raise ConfigError(f"{where}: no command found (a script that runs pretrain_gpt.py, or "
                          "its arguments)")
    scripts = [(i, j) for i, words in enumerate(commands) for j, w in enumerate(words)
               if w.endswith(".py")]
    chosen = ([s for s in scripts if commands[s[0]][s[1]].rsplit("/", 1)[-1]
               .startswith("pretrain")] or scripts)
    if not chosen:
        if len(commands) == 1 and commands[0][0].startswith("--"):
            return Command([], None, commands[0])
        raise ConfigError(f"{where}: no command runs a Python training script (e.g. "
                          "pretrain_gpt.py); give the script, its command line, or only its "
                          "arguments")
    i, j = chosen[-1]
    words = commands[i]
    return Command(words[:j], words[j], words[j + 1:])
