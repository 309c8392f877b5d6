"""Megatron-MoE-ModelZoo's launchers (``importers/modelzoo.py``): the run script followed into
the checkout's sbatch_benchmarking.sh, runtime.conf and model YAML (copies of e8650517 in
``data/real/zoo__repo``), or the YAML with ``--env``; the command they build read as Megatron-LM
arguments. The check: the Qwen3-235B H100 launcher gives validate_moe's config of the
ModelZoo row it runs (row 2, A2A_OVERLAP=1) and its prediction, with each difference from the
sources said."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers import import_config
from ddlsim.importers.modelzoo_sbatch import rules

REAL = Path(__file__).with_name("data") / "real"
REPO = REAL / "zoo__repo"
RUN = REAL / "zoo__run_h100_235b.sh"
YAML = REPO / "model_configs" / "benchmarking" / "Qwen3-235B-A22B.yaml"
#: refused by name in the launcher's command, and what the user gives instead: the
#: tokenizer's vocabulary (Qwen3's config.json: 151,936, a multiple of the YAML's
#: --make-vocab-size-divisible-by 1187 x TP 2), TE's CUDA graphs (not modelled)
IGNORE = ("tokenizer-type", "cuda-graph-impl", "cuda-graph-scope")
#: the tokenizer's vocabulary; the launcher's TE userbuffers TP overlap and overlapped
#: parameter gather, refused with EP > 1 until 2026-11-30, are modelled since (an MoE
#: layer's attention linears, the dense and expert buffers)
SET = ("model.vocab_size=151936",)
OPTIONS = {"system": "dgx-h100", "software": "megatron-core-2025", "ignore": IGNORE,
           "overrides": SET}


def _import(paths, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the not-modelled arguments' warning
        return import_config(paths, **{**OPTIONS, **options}).config


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def test_the_run_script_followed_into_the_checkout_gives_the_commands_fields():
    cfg = _flat(_import([RUN], repo=REPO))
    expected = {
        # the run script's TP=2 PP=8 VPP=4 EP=32 NNODES=32 GBS=2048; MBS=1, SEQ_LEN=4096
        "parallel.tensor_model_parallel_size": 2, "parallel.pipeline_model_parallel_size": 8,
        "parallel.expert_model_parallel_size": 32, "parallel.context_parallel_size": 1,
        "parallel.expert_tensor_parallel_size": 1, "system.nodes": 32,
        "system.devices_per_node": 8, "train.global_batch_size": 2048,
        "train.micro_batch_size": 1, "train.seq_length": 4096,
        # runtime.conf's LAYERS_PER_VP = 96 / 8 / 4 = 3 with the YAML's 94 layers + embedding
        # + loss: (94 + 2) / 8 / 3 = 4 virtual stages
        "parallel.virtual_pipeline_model_parallel_size": 4, "parallel.schedule": "interleaved",
        "parallel.account_for_embedding_in_pipeline_split": True,
        # DISPATCHER=deepep, A2A_OVERLAP=1 (sbatch_benchmarking.sh's flags)
        "parallel.moe.token_dispatcher_type": "flex",
        "parallel.moe.flex_dispatcher_backend": "deepep",
        "parallel.moe.overlap_expert_parallel_comm": True,
        "parallel.moe.delay_wgrad_compute": True,
        # the script's own arguments
        "train.recompute": "selective", "train.recompute_modules": ["moe_act", "layernorm"],
        "parallel.moe.router_force_load_balancing": True,
        # MOE_GROUPED_GEMM=true through envsubst; the YAML's switches
        "parallel.moe.grouped_gemm": True, "parallel.moe.router_fusion": True,
        "parallel.zero_stage": 1, "parallel.sequence_parallel": True, "train.dtype": "bf16",
        # the model from the YAML's flags: Qwen3-235B-A22B's shape, --qk-layernorm
        "model.name": "Qwen3-235B-A22B", "model.num_hidden_layers": 94,
        "model.num_local_experts": 128, "model.num_experts_per_tok": 8,
        "model.moe_intermediate_size": 1536, "model.num_key_value_heads": 4,
        "model.qk_norm": True, "model.tie_word_embeddings": False,
        "model.max_position_embeddings": 4096}
    assert {k: cfg.get(k) for k in expected} == expected


@pytest.mark.filterwarnings("ignore")
def test_the_qwen3_launcher_predicts_validate_moes_modelzoo_row_2():
    """run_h100_235b.sh (A2A_OVERLAP=1: the table's "+1f1b overlap" row) gives zoo_config(row
    2) but for what the sources say differs, and with the row's router the same prediction,
    bit for bit."""
    from benchscripts import load_script
    vm = load_script("validate_moe")
    row = next(r for r in vm.zoo_rows() if r["row"] == "2")
    zoo = vm.zoo_config(row)
    mine = _import([RUN], repo=REPO)
    got, want = _flat(mine), _flat(zoo)
    differ = {k: (got.get(k), want.get(k)) for k in got.keys() | want.keys()
              if got.get(k) != want.get(k)}
    assert {k: v for k, v in differ.items() if k.split(".")[0] != "model"} == {
        # the YAML's --moe-router-fusion (there since 274316a, 2025-08-20); the row's run
        # (2025-05) predates the fused router: validate_moe.ZOO_ROUTER
        "parallel.moe.router_fusion": (True, False),
        # Megatron's default, which zoo_config leaves to ddlsim's (the same aux_loss)
        "parallel.moe.router_load_balancing_type": ("aux_loss", None),
        # PR=bf16's --tp-comm-overlap (sbatch_benchmarking.sh since b09773a, 2025-12-16;
        # the row's run predates it): TE's userbuffers on the attention linears
        "parallel.tp_comm_overlap": ("pipelined", None),
        # #SBATCH --ntasks-per-node=8: dgx-h100's 8
        "system.devices_per_node": (8, None)}
    # the model: the preset's shape, but the YAML's --max-position-embeddings ${SEQ_LEN}
    model = ddlsim.load_config(mine).model.model_dump()
    preset = ddlsim.load_config(zoo).model.model_dump()
    assert {k for k in model if model[k] != preset[k]} == {
        "name", "source", "max_position_embeddings"}
    mine["parallel"]["moe"]["router_fusion"] = False
    overlapped = ddlsim.predict(ddlsim.load_config(mine)).iteration_time_s
    mine["parallel"]["tp_comm_overlap"] = "off"
    assert overlapped < ddlsim.predict(ddlsim.load_config(mine)).iteration_time_s
    assert (ddlsim.predict(ddlsim.load_config(mine)).iteration_time_s
            == ddlsim.predict(ddlsim.load_config(zoo)).iteration_time_s)


ENV = ("TP=2", "PP=8", "EP=32", "CP=1", "VPP=4", "MBS=1", "GBS=2048", "NUM_LAYERS=96",
       "LAYERS_PER_VP=3", "SEQ_LEN=4096", "MOE_GROUPED_GEMM=true", "A2A_OVERLAP=1",
       "NNODES=32")


def test_the_model_yaml_with_env_values_is_the_run_script_without_its_arguments():
    from_yaml = _flat(_import([YAML], env=ENV))
    from_run = _flat(_import([RUN], repo=REPO))
    script_args = {"parallel.moe.router_force_load_balancing", "train.recompute",
                   "train.recompute_modules"}
    assert {k for k in from_yaml.keys() | from_run.keys()
            if from_yaml.get(k) != from_run.get(k)} == script_args


def test_a_variable_the_yaml_needs_and_nobody_sets_is_refused_by_name():
    env = tuple(e for e in ENV if not e.startswith("TP="))
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size <unset:TP>: its "
                                          r"value .* is a variable the script does not set"):
        _import([YAML], env=env)
    with pytest.raises(ConfigError, match=r"VPP is not set and sbatch_benchmarking.sh "
                                          r"compares it with 1.*--env VPP=N"):
        _import([YAML])


def _run_script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


def test_the_launchers_variables_pick_the_flags_as_sbatch_benchmarking_does(tmp_path):
    run = _run_script(tmp_path, "export MODEL=Qwen3-235B-A22B\nDISPATCHER=alltoall "
                                "A2A_OVERLAP=0 EP=8 bash ./sbatch_benchmarking.sh\n")
    cfg = _flat(_import([run], repo=REPO, overrides=SET))
    assert (cfg["parallel.moe.token_dispatcher_type"], cfg["parallel.expert_model_parallel_size"],
            cfg.get("parallel.moe.overlap_expert_parallel_comm"),
            cfg["system.nodes"]) == ("alltoall", 8, None, 32)   # NNODES: runtime.conf's row


def test_fp8_runs_are_refused_by_the_flags_they_add(tmp_path):
    run = _run_script(tmp_path, "PR=fp8 bash ./sbatch_benchmarking.sh\n")
    with pytest.raises(ConfigError, match=r"--fp8-recipe blockwise: ddlsim models "
                                          r"--fp8-recipe delayed or tensorwise only"):
        _import([run], repo=REPO, env=("MODEL=Qwen3-235B-A22B",))


def test_a_run_script_without_the_checkout_or_with_another_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"runs ./sbatch_benchmarking.sh.*--repo FOLDER"):
        _import([RUN])
    other = tmp_path / "repo"
    shutil.copytree(REPO, other)
    with (other / "sbatch_benchmarking.sh").open("a") as f:
        f.write("# a local change\n")
    with pytest.raises(ConfigError, match=r"sbatch_benchmarking.sh differs from "
                                          r"Megatron-MoE-ModelZoo e8650517's"):
        _import([RUN], repo=other)
    with pytest.raises(ConfigError, match=r"--repo is read with a Megatron-MoE-ModelZoo "
                                          r"launcher only"):
        _import([REAL / "titan__llama3_8b.toml"], repo=REPO, ignore=(), overrides=())


@pytest.mark.parametrize("env, params, position, added", [
    # VPP > 1 without a virtual-stage flag: --num-virtual-stages-per-pipeline-rank
    ({"VPP": "4", "PP": "8", "NUM_LAYERS": "96"}, "", "4096",
     [("VPP=4", "--num-virtual-stages-per-pipeline-rank 4")]),
    # layers not a multiple of PP: runtime.conf's PP_FIRST/PP_LAST
    ({"VPP": "1", "PP": "16", "NUM_LAYERS": "61", "PP_FIRST": "4", "PP_LAST": "1"}, "",
     "4096", [("NUM_LAYERS % PP", "--decoder-first-pipeline-num-layers 4 "
                                  "--decoder-last-pipeline-num-layers 1")]),
    # a longer sequence than the YAML's positions; none in the YAML: yq's null, 0 to bash
    ({"VPP": "1", "PP": "1", "NUM_LAYERS": "4", "SEQ_LEN": "8192"}, "", "4096",
     [("SEQ_LEN=8192", "--max-position-embeddings 8192")]),
    ({"VPP": "1", "PP": "1", "NUM_LAYERS": "4", "SEQ_LEN": "8"}, "", None,
     [("SEQ_LEN=8", "--max-position-embeddings 8")]),
])
def test_sbatch_benchmarkings_rules(env, params, position, added):
    got = rules({**env, "DISPATCHER": "none", "PR": "fp8", "OPTIMIZER_OFFLOAD": "1"}, params,
                position)
    assert [a for a in got if not a[0].startswith(("PR=", "OPTIMIZER"))] == added


def test_the_cli_takes_the_checkout_and_env_values(tmp_path):
    from typer.testing import CliRunner

    from ddlsim.cli import app
    out = tmp_path / "zoo.yaml"
    args = ["import", str(RUN), "--repo", str(REPO), "--env", "EP=8", "--system", "dgx-h100",
            "--software", "megatron-core-2025", "-o", str(out)]
    for name in IGNORE:
        args += ["--ignore", name]
    for item in SET:
        args += ["--set", item]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    text = out.read_text()
    # the run script exports no EP and passes EP=32 on the command: the prefix wins
    assert "#   DISPATCHER=deepep -> sbatch_benchmarking.sh adds --moe-token-dispatcher-type" \
           " flex --moe-flex-dispatcher-backend deepep" in text
    assert ddlsim.load_config(out).parallel.expert_model_parallel_size == 32
