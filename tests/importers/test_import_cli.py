"""``ddlsim import`` on the command line: the YAML it writes loads and predicts, outputs are
never overwritten without --force nor written over an input, errors are one paragraph."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app

DATA = Path(__file__).with_name("data")
runner = CliRunner()


def test_import_writes_yaml_that_predicts_as_the_example(tmp_path):
    out = tmp_path / "1t.yaml"
    r = runner.invoke(app, ["import", str(DATA / "megatron-1t-sc21.sh"), "--system", "dgx-a100",
                            "--software", "megatron-lm-2021", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "#   --DDP-impl local -> parallel.overlap_grad_reduce: False" in text
    assert "#   --lr 6.0e-5 -> no effect on one iteration" in text
    assert "warning:" in r.output and "--clip-grad" in r.output
    example = Path(__file__).parents[2] / "examples" / "megatron-1t-3072-a100.yaml"
    assert (ddlsim.predict(ddlsim.load_config(out)).iteration_time_s
            == ddlsim.predict(ddlsim.load_config(example)).iteration_time_s)
    again = runner.invoke(app, ["import", str(DATA / "megatron-1t-sc21.sh"), "--system",
                                "dgx-a100", "-o", str(out)])
    assert again.exit_code == 2 and "already exists; pass --force" in again.output


def test_import_never_writes_over_its_input(tmp_path):
    src = tmp_path / "run.sh"
    src.write_text("python pretrain_gpt.py --num-layers 2\n")
    r = runner.invoke(app, ["import", str(src), "-o", str(src), "--force"])
    assert r.exit_code == 2 and "is an input of this command" in r.output
    assert src.read_text() == "python pretrain_gpt.py --num-layers 2\n"


def test_import_errors_name_the_argument_and_the_missing_system(tmp_path):
    src = tmp_path / "run.sh"
    src.write_text("python pretrain_gpt.py --num-layers 2 --frobnicate\n")
    r = runner.invoke(app, ["import", str(src), "--system", "dgx-h100"])
    assert r.exit_code == 2 and "--frobnicate: not a Megatron-LM flag ddlsim reads" in r.output
    assert "Traceback" not in r.output
    # a launcher that names no node count (here no torchrun, whose default is one node)
    src.write_text((DATA / "gpt3-175b.sh").read_text().replace("--nnodes $NUM_NODES", "")
                   .replace("torchrun ${DISTRIBUTED_ARGS[@]} ", ""))
    r = runner.invoke(app, ["import", str(src)])
    assert r.exit_code == 2
    assert "give --system PRESET" in r.output and "and --nodes N" in r.output


def test_arguments_lists_what_a_reader_maps_and_a_refusal_points_to_it(tmp_path):
    """``--arguments READER`` prints the reader's arguments one a line (the refusal of an
    unmappable argument counts them and names this command instead of listing them all);
    a misspelt reader, files beside it, or no files at all are refused by name."""
    from ddlsim.importers import importers
    r = runner.invoke(app, ["import", "--arguments", "megatron"])
    assert r.exit_code == 0
    known = importers()["megatron"].known()
    assert r.output.splitlines() == known and "--tensor-model-parallel-size" in known
    src = tmp_path / "run.sh"
    src.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --frobnicate\n")
    r = runner.invoke(app, ["import", str(src), "--system", "dgx-h100"])
    assert r.exit_code == 2 and "--frobnicate: not a Megatron-LM flag ddlsim reads" in r.output
    assert (f"ddlsim reads {len(known)} Megatron-LM arguments: `ddlsim import --arguments "
            "megatron` lists them") in " ".join(r.output.split())
    assert "--pipeline-model-parallel-size" not in r.output  # the list is not repeated
    for argv, message in ((["--arguments", "megatorn"], "'megatorn' is not a reader (did you "
                                                        "mean 'megatron'?)"),
                          (["--arguments", "hf", str(src)], "give it without files (got 1)"),
                          ([], "give the files to import")):
        r = runner.invoke(app, ["import", *argv])
        assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output
        assert "Traceback" not in r.output
