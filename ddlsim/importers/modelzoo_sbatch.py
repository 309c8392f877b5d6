"""What Megatron-MoE-ModelZoo's ``sbatch_benchmarking.sh`` does to build the Megatron-LM
command, transcribed from yanring/Megatron-MoE-ModelZoo e8650517d60d71ab73fc6b3b0388cac4ba435181
(2026-05-16) with the two files it sources, ``runtime_configs/benchmarking/common.conf`` and
``runtime.conf``; line numbers are that commit's. ddlsim runs nothing: it applies these rules to
the variables and reads the command that results (:mod:`.modelzoo`).

The steps, in the script's order:

1. ``WORKSPACE``, the script's folder, and defaults of ``MODEL``, ``CLUSTER``,
   ``MEGATRON_PATH`` (lines 5-12); ``common.conf``: the training script
   ``${MEGATRON_PATH}/pretrain_gpt.py``, the model YAML
   ``${WORKSPACE}/model_configs/benchmarking/${MODEL}.yaml`` and ``PR`` in bf16/fp8/mxfp8
   (lines 2-3, 21-25); ``runtime.conf``: the model's row of ``BENCHMARKING_MODEL_CONFIGS`` for
   each of ``TP PP EP CP VPP MBS GBS NUM_LAYERS MOE_TOKEN_DISPATCHER MOE_GROUPED_GEMM NNODES
   RUN_TIME PRETRAIN SEQ_LEN DATASET [PP_FIRST PP_LAST]`` not already set (bash's ``:-``: an
   empty value counts as unset), ``LAYERS_PER_VP = NUM_LAYERS / PP / VPP`` when ``VPP > 1``
   (else ``false``) and ``PP_FIRST``/``PP_LAST`` only when ``NUM_LAYERS % PP`` (lines 20-77);
2. ``envsubst`` on the YAML, then ``yq`` turns ``MODEL_ARGS`` into flags: a value ``false`` drops
   the flag, ``true`` is a switch, any other ``--key value`` (lines 24-38), and the script's own
   arguments follow (lines 40-43); ``ENV_VARS`` are exported (lines 45-52);
3. :func:`rules`, lines 54-150; the job runs ``NNODES`` nodes of 8 tasks, 4 with
   ``GB200_CLUSTER=1`` (lines 167-178).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..errors import ConfigError

__all__ = ["COMMIT", "SHA256", "check_scripts", "model_row", "rules", "tasks_per_node"]

COMMIT = "e8650517"

#: sha256 of the code transcribed here, at e8650517: sbatch_benchmarking.sh whole, common.conf
#: whole, runtime.conf from its function ``set_model_configs`` on (the table above it is read)
SHA256 = {
    "sbatch_benchmarking.sh":
        "cbfdc674473912f58157fabece4d2c6e4d83934f9e0ce5d765ece301f8940ed9",
    "runtime_configs/benchmarking/common.conf":
        "bbb42da08aeb7a00364b1e466b4d80c4472353aa191e211d1497e873f2596dd3",
    "runtime_configs/benchmarking/runtime.conf":
        "96706df279ce24106c6fd345f8561ede238559696dc72b2f01fc03ed378250b0",
}

#: runtime.conf's columns, in order (its comment line 5 and set_model_configs lines 20-74)
COLUMNS = ("TP", "PP", "EP", "CP", "VPP", "MBS", "GBS", "NUM_LAYERS", "MOE_TOKEN_DISPATCHER",
           "MOE_GROUPED_GEMM", "NNODES", "RUN_TIME", "PRETRAIN", "SEQ_LEN", "DATASET")
_ROW = re.compile(r'^\s*\[([^\]]+)\]="([^"]*)"', re.M)
_TABLE_END = re.compile(r"^\)\s*$", re.M)


def _code(repo: Path, name: str) -> str:
    text = (repo / name).read_text()
    if name.endswith("runtime.conf"):
        end = _TABLE_END.search(text)
        return text[end.end():] if end else text
    return text


def check_scripts(repo: Path) -> None:
    """Refuse a checkout whose scripts are not the ones transcribed here (:data:`SHA256`),
    naming the file."""
    for name, digest in SHA256.items():
        path = repo / name
        if not path.is_file():
            raise ConfigError(f"--repo {repo}: no {name}; give the Megatron-MoE-ModelZoo "
                              "checkout the run script runs in")
        got = hashlib.sha256(_code(repo, name).encode()).hexdigest()
        if got != digest:
            raise ConfigError(f"--repo {repo}: {name} differs from Megatron-MoE-ModelZoo "
                              f"{COMMIT}'s, whose rules ddlsim follows without running them "
                              "(importers/modelzoo_sbatch.py); give the command line it runs "
                              "instead")


def _int(env: dict[str, str], name: str, why: str) -> int:
    value = env.get(name)
    if value is None:
        raise ConfigError(f"{name} is not set and sbatch_benchmarking.sh {why}; give it "
                          f"(--env {name}=N, or --repo for runtime.conf's row)")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: sbatch_benchmarking.sh {why}, as a whole "
                          "number") from None


def model_row(repo: Path, env: dict[str, str]) -> None:
    """``common.conf`` and ``runtime.conf`` applied to ``env``: the model's row for each
    variable not set, ``LAYERS_PER_VP`` and the uneven split's ``PP_FIRST``/``PP_LAST``."""
    model = env.get("MODEL") or "your_own_model"
    text = (repo / "runtime_configs/benchmarking/runtime.conf").read_text()
    rows = dict(_ROW.findall(text))
    if model not in rows:
        raise ConfigError(f"MODEL={model}: not a row of runtime.conf's "
                          f"BENCHMARKING_MODEL_CONFIGS ({', '.join(rows)}), where "
                          "sbatch_benchmarking.sh stops ('Error: Invalid model')")
    config = rows[model].split()
    for name, value in zip(COLUMNS, config):
        if not env.get(name):
            env[name] = value
    layers = _int(env, "NUM_LAYERS", "reads it")
    pp, vpp = _int(env, "PP", "reads it"), _int(env, "VPP", "compares it with 1")
    if vpp <= 1:
        env["LAYERS_PER_VP"] = "false"
    elif not env.get("LAYERS_PER_VP"):
        env["LAYERS_PER_VP"] = str(layers // pp // vpp)
    uneven = layers % pp != 0
    for i, name in ((15, "PP_FIRST"), (16, "PP_LAST")):
        if not env.get(name) or not uneven:
            env[name] = config[i] if uneven and i < len(config) else "false"


def tasks_per_node(env: dict[str, str]) -> int:
    """GPUs per node of the job: 4 on a GB200 cluster, else 8 (lines 167-178)."""
    return 4 if env.get("GB200_CLUSTER", "0") == "1" else 8


def rules(env: dict[str, str], params: str,
          max_position: str | None) -> list[tuple[str, str]]:
    """The flags sbatch_benchmarking.sh adds from its variables after the YAML's (lines
    54-150), each with the variable that adds it: ``[(variable=value, flags), …]``.
    ``params`` is the command so far; ``max_position`` the YAML's
    ``--max-position-embeddings`` after envsubst (None where it has none: ``yq`` prints
    ``null``, which bash's ``-gt`` reads as 0)."""
    out: list[tuple[str, str]] = []

    def add(var: str, flags: str) -> None:
        nonlocal params
        out.append((var, flags))
        params += " " + flags

    vpp, pp = _int(env, "VPP", "compares it with 1"), _int(env, "PP", "reads it")
    if vpp > 1 and not any(f in params for f in (
            "--pipeline-model-parallel-layout", "--num-virtual-stages-per-pipeline-rank",
            "--num-layers-per-virtual-pipeline-stage")):
        add(f"VPP={vpp}", f"--num-virtual-stages-per-pipeline-rank {vpp}")
    if _int(env, "NUM_LAYERS", "reads it") % pp and (
            "--pipeline-model-parallel-layout" not in params):
        add("NUM_LAYERS % PP", f"--decoder-first-pipeline-num-layers {env.get('PP_FIRST')} "
                                f"--decoder-last-pipeline-num-layers {env.get('PP_LAST')}")
    offload = env.get("OPTIMIZER_OFFLOAD") or "0"
    if offload == "1":
        add("OPTIMIZER_OFFLOAD=1", "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d")
    dispatcher = env.get("DISPATCHER") or "deepep"
    add_dispatcher = {"alltoall": "--moe-token-dispatcher-type alltoall",
                      "deepep": "--moe-token-dispatcher-type flex "
                                "--moe-flex-dispatcher-backend deepep",
                      "hybridep": "--moe-token-dispatcher-type flex --moe-flex-dispatcher-"
                                  "backend hybridep --moe-hybridep-num-sms 32"}.get(dispatcher)
    if add_dispatcher:
        add(f"DISPATCHER={dispatcher}", add_dispatcher)
    _precision(env, offload, add)
    if (env.get("A2A_OVERLAP") or "0") == "1":
        add("A2A_OVERLAP=1", "--delay-wgrad-compute --overlap-moe-expert-parallel-comm")
    seq = env.get("SEQ_LEN")
    if seq:
        limit = 0 if max_position is None else _int({"M": max_position}, "M", "compares "
                                                    "SEQ_LEN with --max-position-embeddings")
        if _int(env, "SEQ_LEN", "compares it with --max-position-embeddings") > limit:
            add(f"SEQ_LEN={seq}", f"--max-position-embeddings {seq}")
    profile = env.get("PROFILE", "")
    steps = "--profile --profile-step-start 23 --profile-step-end 25 --profile-ranks 0"
    if profile in ("1", "nsys"):
        add(f"PROFILE={profile}", steps)
    elif profile == "torch":
        add("PROFILE=torch", steps + " --use-pytorch-profiler")
    return out


def _precision(env: dict[str, str], offload: str, add) -> None:
    """Lines 84-107: the flags of ``PR`` (bf16, fp8 or mxfp8; common.conf stops on others)."""
    pr = env.get("PR") or "bf16"
    if pr not in ("bf16", "fp8", "mxfp8"):
        raise ConfigError(f"PR={pr!r}: common.conf allows 'bf16', 'fp8' or 'mxfp8' and stops "
                          "the job otherwise")
    optimizer = ("--use-precision-aware-optimizer --main-grads-dtype fp32 --main-params-dtype "
                 "fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    if pr == "fp8":
        gather = " --fp8-param-gather" if offload == "0" else ""
        add("PR=fp8", f"--fp8-recipe blockwise --fp8-format e4m3{gather} {optimizer} "
                      "--moe-router-padding-for-fp8")
    elif pr == "bf16":
        add("PR=bf16", "--tp-comm-overlap")
    else:
        gather = (" --fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag --overlap-grad-reduce"
                  " --overlap-param-gather" if offload == "0" else "")
        add("PR=mxfp8", f"--fp8-recipe mxfp8 --fp8-format e4m3{gather} {optimizer} "
                        "--moe-router-padding-for-quantization")
