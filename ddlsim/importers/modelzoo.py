"""Megatron-MoE-ModelZoo's launchers (yanring/Megatron-MoE-ModelZoo) → the Megatron-LM command
they run → ddlsim fields.

Two ways in:

* a run script (``best_practice/qwen3/run_h100_235b.sh``), which exports variables and runs
  ``VAR=x … bash ./sbatch_benchmarking.sh ARGS``, with ``--repo FOLDER``, the ModelZoo
  checkout it runs in: the script's exports, the command's ``VAR=x`` prefixes and
  ``--env NAME=value`` (the environment it is run from) are the variables;
* a model YAML (``model_configs/benchmarking/Qwen3-235B-A22B.yaml``) with ``--env NAME=value``
  for the variables it and sbatch_benchmarking.sh read (``--repo`` adds runtime.conf's row).

Either way ddlsim does what sbatch_benchmarking.sh does (:mod:`.modelzoo_sbatch`): the
model's row for the variables not set, the YAML's ``MODEL_ARGS`` with the variables
substituted as ``envsubst`` substitutes them (``$NAME``, ``${NAME}``), read as ``yq`` reads
them (``false`` drops a flag, ``true`` is a switch), the run script's ARGS after them, then the
flags its variables add; the command is read by :mod:`.megatron`, so each argument is mapped,
without effect, not modelled or refused by name. Where envsubst would substitute an empty
string for a variable that is not set, ddlsim keeps it as not set: the flag that needs its
value is refused by name (a data path is left alone).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError
from .common import Draft
from .modelzoo_sbatch import COMMIT, check_scripts, model_row, rules, tasks_per_node
from .shell import UNSET, Command, read_script

__all__ = ["read_modelzoo", "is_modelzoo_launcher"]

_SBATCH = "sbatch_benchmarking.sh"
_LAUNCHES = re.compile(r"^[^#\n]*\bsbatch_benchmarking\.sh\b", re.M)
_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_]\w*)=", re.M)
_PREFIX = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
#: what envsubst substitutes: ``$NAME`` and ``${NAME}`` (GNU gettext's envsubst(1))
_ENVSUBST = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


def is_modelzoo_launcher(text: str) -> bool:
    """Whether a script runs the ModelZoo's ``sbatch_benchmarking.sh``."""
    return bool(_LAUNCHES.search(text))


def _env_options(env: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in env:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ConfigError(f"--env {item!r}: expects NAME=value (a variable of the "
                              "launcher, e.g. --env TP=2)")
        out[name] = value
    return out


def read_modelzoo(path: Path, repo: Path | None = None, env: tuple[str, ...] = ()) -> Draft:
    """The ddlsim fields of a ModelZoo run script (with ``repo``) or model YAML.

    Parameters
    ----------
    path : Path
        The run script (text that runs ``sbatch_benchmarking.sh``) or the model YAML.
    repo : Path, optional
        The Megatron-MoE-ModelZoo checkout (required with a run script).
    env : tuple of str
        ``NAME=value`` variables of the environment the launcher runs in.

    Returns
    -------
    Draft
        The fields of the Megatron-LM command the launcher builds, and the fate of every
        argument, with what sbatch_benchmarking.sh added and why.
    """
    values, where = _env_options(env), str(path)
    args: list[str] = []
    notes: list[tuple[str, str]] = []
    if path.suffix.lower() in (".yaml", ".yml"):
        params_path = path
    else:
        args, notes = _run_script(path, values)
        if repo is None:
            raise ConfigError(f"{where}: it runs ./{_SBATCH}, which builds the Megatron-LM "
                              "command from the ModelZoo's files; give the checkout it runs "
                              "in with --repo FOLDER")
        params_path = None
    if repo is not None:
        check_scripts(repo)
        values["WORKSPACE"] = str(repo.resolve())     # line 5: the script's own folder
        model_row(repo, values)
        notes.append((f"runtime.conf [{values.get('MODEL')}]", "the model's row for the "
                      "variables not set: " + " ".join(f"{k}={values[k]}" for k in (
                          "TP", "PP", "EP", "CP", "VPP", "MBS", "GBS", "NUM_LAYERS",
                          "LAYERS_PER_VP", "SEQ_LEN", "NNODES"))))
        params_path = params_path or _params_path(repo, values)
    words, added = _command(params_path, values, args, notes)
    script = values.get("TRAINING_SCRIPT_PATH") or (
        f"{values.get('MEGATRON_PATH') or 'your_own_megatron_path'}/pretrain_gpt.py")
    from .megatron import read_megatron_command
    draft = read_megatron_command(Command([], script, words), where,
                                  name=values.get("MODEL"))
    for arg, outcome in notes + added:
        draft.note(arg, outcome)
    _system(draft, values)
    return draft


def _run_script(path: Path, env: dict[str, str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The arguments the run script passes to sbatch_benchmarking.sh; ``env`` becomes what
    that script sees (the exports, the command's ``VAR=x`` prefixes, the ``--env`` values)."""
    text = path.read_text()
    given = dict(env)
    local = dict(env)
    commands = read_script(text, str(path), local)
    exported = set(_EXPORT.findall(text)) | set(given)
    for words in commands:
        prefix = []
        while words and _PREFIX.match(words[0]):
            prefix.append(_PREFIX.match(words[0]).groups())
            words = words[1:]
        at = [i for i, w in enumerate(words[:2]) if w.rsplit("/", 1)[-1] == _SBATCH]
        if at and (at[0] == 0 or words[0] in ("bash", "sh")):
            env.clear()
            env.update({k: v for k, v in local.items() if k in exported})
            env.update(prefix)
            shown = " ".join(f"{k}={v}" for k, v in prefix)
            note = (f"{' '.join(words[:at[0] + 1])} ({shown})",
                    f"Megatron-MoE-ModelZoo's launcher ({COMMIT}'s rules): its variables, "
                    "the run script's exports and these, build the Megatron-LM command")
            return words[at[0] + 1:], [note]
    raise ConfigError(f"{path}: no command runs {_SBATCH}")


def _params_path(repo: Path, env: dict[str, str]) -> Path:
    """common.conf's ``TRAINING_PARAMS_PATH`` (relative paths read from the checkout)."""
    given = env.get("TRAINING_PARAMS_PATH")
    path = Path(given) if given else (Path(env["WORKSPACE"]) / "model_configs" / "benchmarking"
                                      / f"{env.get('MODEL') or 'your_own_model'}.yaml")
    path = path if path.is_absolute() else repo / path      # the launcher runs in the checkout
    if not path.is_file():
        raise ConfigError(f"TRAINING_PARAMS_PATH {path}: no such file, where "
                          f"{_SBATCH} stops ('Error: TRAINING_PARAMS_PATH does not exist')")
    return path


def _command(params_path: Path, env: dict[str, str], args: list[str],
             notes: list[tuple[str, str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """The words of the Megatron-LM command: ``TRAINING_PARAMS``, the YAML's flags, the
    script's arguments, then what sbatch_benchmarking.sh's rules add."""
    text = _ENVSUBST.sub(lambda m: env.get(m.group(1) or m.group(2),
                                           UNSET.format(m.group(1) or m.group(2))),
                         params_path.read_text())
    flags, env_vars, max_position = _yaml_flags(text, str(params_path))
    notes.append((str(params_path), f"MODEL_ARGS after envsubst, as yq reads them: "
                                    f"{len(flags)} flags"))
    params = " ".join([env.get("TRAINING_PARAMS", ""), *flags, *args])
    for name, value in env_vars:
        env[name] = value
        notes.append((f"ENV_VARS {name}={value}", "the job's environment: not read by ddlsim"))
    added = rules(env, params, max_position)
    for _, more in added:
        params += " " + more
    return params.split(), [(var, f"{_SBATCH} adds {more}") for var, more in added]


def _yaml_flags(text: str, where: str) -> tuple[list[str], list[tuple[str, str]], str | None]:
    """``MODEL_ARGS`` as yq turns them into flags (each ``--key value``, ``--key`` for
    ``true``, nothing for ``false``), ``ENV_VARS`` as pairs, and the
    ``--max-position-embeddings`` value (None when absent)."""
    import yaml
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({exc})") from None
    sections = {k.value: v for k, v in root.value} if isinstance(
        root, yaml.MappingNode) else {}
    if not isinstance(sections.get("MODEL_ARGS"), yaml.MappingNode):
        raise ConfigError(f"{where}: not a Megatron-MoE-ModelZoo model YAML (it has no "
                          "MODEL_ARGS mapping of flags)")
    flags, max_position = [], None
    for key, node in sections["MODEL_ARGS"].value:
        if not isinstance(node, yaml.ScalarNode):
            raise ConfigError(f"{where}: MODEL_ARGS {key.value}: expects one value (yq joins "
                              "key and value as text)")
        value = node.value
        if key.value == "--max-position-embeddings":
            max_position = value
        if value != "false":
            flags.append(key.value if value == "true" else f"{key.value} {value}")
    env_node = sections.get("ENV_VARS")
    env_vars = [(k.value, v.value) for k, v in env_node.value] if isinstance(
        env_node, yaml.MappingNode) else []
    return flags, env_vars, max_position


def _system(draft: Draft, env: dict[str, str]) -> None:
    """The job's size: ``#SBATCH --nodes=${NNODES}``, ``--ntasks-per-node`` 8 (4 on GB200)."""
    nodes = env.get("NNODES")
    if nodes is not None and not nodes.isdigit():
        draft.refuse(f"NNODES={nodes}", "expects a whole number of nodes")
    elif nodes is not None:
        draft.set("system.nodes", int(nodes), f"NNODES={nodes} (#SBATCH --nodes)")
    per_node = tasks_per_node(env)
    draft.set("system.devices_per_node", per_node,
              f"#SBATCH --ntasks-per-node={per_node} ({_SBATCH}: 4 with GB200_CLUSTER=1, "
              "else 8)")
