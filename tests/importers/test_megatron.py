"""``ddlsim import`` of Megatron-LM launch scripts and command lines: every argument mapped,
declared without effect, or refused by name; the bundled examples round-trip."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimWarning
from ddlsim.importers import import_config
from ddlsim.importers.megatron import read_megatron
from ddlsim.importers.shell import read_command

DATA = Path(__file__).with_name("data")
EXAMPLES = Path(__file__).parents[2] / "examples"


def _imported(tmp_path: Path, *args: str, **options) -> dict:
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py "
                      + " ".join(args) + "\n")
    return import_config([script], **{"system": "dgx-h100", **options}).config


BASE = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16")


def test_megatron_1t_script_round_trips_to_the_examples_prediction():
    """The 1T row's arguments (examples/sc21 CONFIG.sh, interleaved as the example) give
    the hand-written example's config and the same prediction, bit for bit."""
    with pytest.warns(DDLSimWarning, match="not modelled by ddlsim: --clip-grad 1.0"):
        imported = import_config([DATA / "megatron-1t-sc21.sh"], system="dgx-a100",
                                 software="megatron-lm-2021").config
    mine = ddlsim.predict(ddlsim.load_config(imported))
    hand = ddlsim.predict(ddlsim.load_config(EXAMPLES / "megatron-1t-3072-a100.yaml"))
    assert mine.iteration_time_s == hand.iteration_time_s
    assert mine.memory == hand.memory
    assert imported["model"]["vocab_size"] == 51200     # 50257 padded to 128 × TP8


def test_llama2_70b_arguments_round_trip_to_the_examples_prediction():
    """Llama-style flags (RMSNorm, rope, SwiGLU, GQA, no biases, untied) give the llama family
    with the published config.json's shape, and the example's prediction bit for bit."""
    with pytest.warns(DDLSimWarning, match="clip-grad"):
        imported = import_config([DATA / "llama2-70b-nemo.sh"], system="dgx-h100").config
    mine = ddlsim.predict(ddlsim.load_config(imported))
    with warnings.catch_warnings():     # the bundled config.json's extra keys are all
        warnings.simplefilter("error")  # declared without effect (models/hf_keys.py)
        hand = ddlsim.predict(ddlsim.load_config(EXAMPLES / "llama2-70b-64-h100.yaml"))
    assert mine.iteration_time_s == hand.iteration_time_s
    assert mine.memory == hand.memory


def test_gpt3_script_differs_from_the_example_only_by_megatrons_padded_vocabulary():
    """Megatron-LM pads GPT-2's 50,257 tokens to 51,200 at TP 8; the example keeps 50,257.
    With that one field made equal, the predictions are the same."""
    with pytest.warns(DDLSimWarning, match="clip-grad"):
        imported = import_config([DATA / "gpt3-175b.sh"], system="dgx-a100").config
    hand = ddlsim.load_config(EXAMPLES / "gpt3-175b-1024-a100.yaml",
                              overrides=["model.vocab_size=51200"])
    mine = ddlsim.load_config(imported)
    assert mine.parallel == hand.parallel and mine.train == hand.train
    assert ddlsim.predict(mine).iteration_time_s == ddlsim.predict(hand).iteration_time_s


def test_script_variables_arrays_and_arithmetic_are_expanded():
    cmd = read_command(
        "N=2\nG=${GPUS:-8}\nW=$(($G*$N))\nA=(\n  --num-layers 4 # four\n  --seq-length $W\n)\n"
        "torchrun --nnodes $N run/pretrain_gpt.py ${A[@]} \\\n  --save $1\n", "s.sh")
    assert cmd.launcher == ["torchrun", "--nnodes", "2"]
    assert cmd.script == "run/pretrain_gpt.py"
    assert cmd.args == ["--num-layers", "4", "--seq-length", "16", "--save", "<unset:1>"]


def test_an_unset_variable_is_refused_only_where_its_value_matters(tmp_path):
    with pytest.raises(ConfigError, match=r"--num-layers <unset:LAYERS>.*does not set"):
        _imported(tmp_path, BASE.replace("--num-layers 32", "--num-layers $LAYERS"))
    cfg = _imported(tmp_path, BASE, "--save $CHECKPOINT")     # a path: no effect
    assert cfg["model"]["num_hidden_layers"] == 32


def test_a_script_that_loops_is_refused():
    with pytest.raises(ConfigError, match="loops or branches by 'for"):
        read_command("for i in 1 2; do\n  TP=$i\ndone\npython pretrain_gpt.py --num-layers 2",
                     "s.sh")


def test_branches_the_script_decides_are_followed():
    """``if`` on the script's own variables is decided as bash would (``[[ == ]]``, ``-eq``,
    ``-n``, ``||``, ``else``, one-line ``if …; then …; fi``), arrays appended with ``+=``."""
    cmd = read_command(
        'DTYPE="fp8"\nN=2\nA=(--num-layers 4)\nif [[ "$DTYPE" == "fp8" ]]; then\n'
        '  A+=("--fp8-format hybrid")\nelif [ $N -eq 2 ]; then\n  A+=(--bf16)\nfi\n'
        'if [ -n "" ] || [ $N -gt 3 ]; then A+=(--x); else A+=(--seq-length $N); fi\n'
        'python pretrain_gpt.py ${A[@]}\n', "s.sh")
    assert cmd.args == ["--num-layers", "4", "--fp8-format", "hybrid", "--seq-length", "2"]


def test_a_branch_only_running_the_script_decides_is_refused_where_it_matters(tmp_path):
    """A condition on an environment variable or a file is followed both ways: accepted when
    both give the same fields (a logging flag, an ``exit`` path), refused naming it when
    they do not."""
    same = ('A=(--num-layers 32)\nif [ -n "${WANDB_API_KEY}" ]; then\n  A+=(--wandb-project x)'
            '\nfi\nif [ ! -f pretrain_gpt.py ]; then\n  exit 1\nfi\n')
    script = tmp_path / "run.sh"
    script.write_text(same + "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py ${A[@]} "
                      + BASE.replace("--num-layers 32", "") + "\n")
    cfg = import_config([script], system="dgx-h100").config
    assert cfg["model"]["num_hidden_layers"] == 32
    script.write_text('TP=1\nif [ "$USE_TP" = 1 ]; then TP=2; fi\ntorchrun --nproc_per_node 8 '
                      "--nnodes 2 pretrain_gpt.py --tensor-model-parallel-size $TP " + BASE)
    with pytest.raises(ConfigError, match=r'if \[ "\$USE_TP" = 1 \] is true.*'
                                          r"parallel.tensor_model_parallel_size \(1 or 2\)"):
        import_config([script], system="dgx-h100")


def test_unknown_flags_are_refused_by_name_unless_ignored(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _imported(tmp_path, BASE, "--my-flag 3 --tensor-model-paralel-size 2")
    text = str(exc.value)
    assert "--my-flag 3" in text and "did you mean 'tensor-model-parallel-size'" in text
    assert "--ignore" in text and "`ddlsim import --arguments megatron` lists them" in text
    cfg = _imported(tmp_path, BASE, "--my-flag 3", ignore=("my-flag",))
    assert cfg["model"]["num_hidden_layers"] == 32


@pytest.mark.parametrize("flags, path, value", [
    ("--use-distributed-optimizer", ("parallel", "zero_stage"), 1),
    ("--tensor-model-parallel-size 2 --sequence-parallel",
     ("parallel", "sequence_parallel"), True),
    ("--recompute-granularity selective", ("train", "recompute"), "selective"),
    ("--attention-backend flash", ("system", "software", "kernels", "attention"), "flash2"),
    ("--attention-backend fused", ("system", "software", "kernels", "attention"), "cudnn"),
    ("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2",
     ("parallel", "virtual_pipeline_model_parallel_size"), 4),
])
def test_flags_map_to_ddlsim_fields(tmp_path, flags, path, value):
    node = _imported(tmp_path, BASE, flags)
    for key in path:
        node = node[key]
    assert node == value


def test_llama_style_flags_give_the_llama_family_with_megatrons_defaults(tmp_path):
    cfg = _imported(tmp_path, BASE, "--normalization RMSNorm --position-embedding-type rope "
                    "--swiglu --group-query-attention --num-query-groups 8 "
                    "--disable-bias-linear --untie-embeddings-and-output-weights "
                    "--attention-dropout 0.0 --hidden-dropout 0.0 --vocab-size 128256")
    m = cfg["model"]
    assert m["architecture"] == "llama" and m["num_key_value_heads"] == 8
    assert m["intermediate_size"] == int((4 * 4096 * 2 / 3) / 64) * 64 == 10880
    assert m["attention_bias"] is False and m["tie_word_embeddings"] is False
    assert m["vocab_size"] == 128256          # a multiple of 128 × TP1 already


def test_a_half_llama_half_gpt_model_and_default_dropout_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="this mix is none of them"):
        _imported(tmp_path, BASE, "--normalization RMSNorm")
    with pytest.raises(ConfigError, match=r"--attention-dropout 0.1 \(Megatron's default\)") as exc:
        _imported(tmp_path, BASE, "--normalization RMSNorm --position-embedding-type rope "
                  "--swiglu --vocab-size 32000")
    # the recipes' flags named once, not once per refused default
    assert str(exc.value).count("Megatron's Llama recipes set --attention-dropout 0.0") == 1


def test_the_launcher_gives_the_nodes_and_nodes_replaces_it(tmp_path):
    assert _imported(tmp_path, BASE)["system"]["nodes"] == 2
    assert _imported(tmp_path, BASE, nodes=4)["system"]["nodes"] == 4


def test_a_plan_larger_than_the_launchers_nodes_names_the_nodes_option(tmp_path):
    """Megatron-LM's example scripts launch one node and set a plan for many (the GPT-3 175B
    one: TP 8 × PP 16 with NUM_NODES=1): the refusal says how to import for more nodes."""
    with pytest.raises(ConfigError, match=r"system.nodes = 2: --nodes N imports the plan"):
        _imported(tmp_path, BASE, "--tensor-model-parallel-size 8",
                  "--pipeline-model-parallel-size 4")
    cfg = _imported(tmp_path, BASE, "--tensor-model-parallel-size 8",
                    "--pipeline-model-parallel-size 4", nodes=4)
    assert cfg["system"]["nodes"] == 4


def test_notes_say_what_became_of_every_argument():
    draft = read_megatron("python pretrain_gpt.py --lr 1e-4 --clip-grad 1.0 --fp16", "x.sh")
    notes = dict(draft.notes)
    assert notes["--lr 1e-4"].startswith("no effect")
    assert notes["--clip-grad 1.0"].startswith("not modelled")
    assert notes["--fp16"] == "train.dtype: 'fp16'"


def test_fp8_runs_pass_bf16_and_an_fp8_format(tmp_path):
    cfg = _imported(tmp_path, BASE, "--fp8-format hybrid", system="dgx-h100")
    assert cfg["train"]["dtype"] == "fp8"
    with pytest.raises(ConfigError, match="FP8 over fp16 parameters"):
        _imported(tmp_path, BASE.replace("--bf16", "--fp16"), "--fp8-format hybrid")


def test_sequence_parallelism_is_off_at_tp1_as_megatron_turns_it_off(tmp_path):
    cfg = _imported(tmp_path, BASE, "--sequence-parallel")
    assert "sequence_parallel" not in cfg.get("parallel", {})


@pytest.mark.parametrize("software, attention", [("megatron-lm-2021", "unfused"),
                                                 ("deepspeed", "unfused"),
                                                 (None, None), ("megatron-core-2025", None)])
def test_no_masked_softmax_fusion_unfuses_only_megatrons_own_attention(tmp_path, software,
                                                                       attention):
    """Megatron's own scale-mask-softmax (2021, Megatron-DeepSpeed) is unfused by the flag;
    Megatron-Core's TransformerEngine attention ignores it (dot_product_attention.py)."""
    cfg = _imported(tmp_path, BASE, "--no-masked-softmax-fusion", software=software)
    sw = cfg["system"].get("software")
    got = sw.get("kernels", {}).get("attention") if isinstance(sw, dict) else None
    assert got == attention


def test_an_echo_names_no_script_and_an_exit_after_the_run_keeps_it():
    cmd = read_command("python run/pretrain_gpt.py --num-layers 2\n"
                       "echo done: pretrain_gpt.py --num-layers 9\nexit $?\n", "s.sh")
    assert cmd.args == ["--num-layers", "2"]


@pytest.mark.parametrize("launcher, word, nodes", [
    ("torchrun --nproc_per_node 8", "torchrun", 1),            # torchrun's default --nnodes
    ("python -m torch.distributed.run --nproc-per-node 8", "torch.distributed.run", 1),
    ("/opt/conda/bin/torchrun --nproc_per_node 8 --nnodes 4", "", 4),
])
def test_a_torchrun_line_without_nnodes_is_one_node_as_torchrun_defaults(tmp_path, launcher,
                                                                         word, nodes):
    """torchrun's ``--nnodes`` defaults to one node (torch/distributed/run.py), so its line
    needs no ``--nodes``; the YAML says where the field came from. A launcher whose node
    count is elsewhere (none here) still needs ``--nodes``."""
    script = tmp_path / "run.sh"
    script.write_text(f"{launcher} pretrain_gpt.py {BASE}\n")
    got = import_config([script], system="dgx-h100")
    assert got.config["system"]["nodes"] == nodes
    if nodes == 1:
        notes = [n for d in got.drafts for n in d.notes]
        assert (word + " without --nnodes: one node, its default",
                "system.nodes: 1") in notes
    script.write_text(f"pretrain_gpt.py {BASE}\n")
    with pytest.raises(ConfigError, match=r"the system is not in these files: give --nodes N"):
        import_config([script], system="dgx-h100")
