"""``ddlsim import`` of DeepSpeed configs, torchtitan TOML and Hugging Face model folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimWarning
from ddlsim.importers import detect, import_config

DATA = Path(__file__).with_name("data")
HF = Path(ddlsim.__file__).parent / "data" / "hf"

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _ds(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_ds_config_with_a_hf_model_gives_a_deepspeed_zero3_run():
    cfg = import_config([DATA / "ds_zero3.json", HF / "llama-3.1-8b.json"], system="dgx-h100",
                        nodes=32, overrides=("train.seq_length=4096",)).config
    assert cfg["parallel"]["zero_stage"] == 3
    assert cfg["system"]["software"]["stack"] == "deepspeed"
    assert cfg["train"] == {"global_batch_size": 512, "micro_batch_size": 1, "dtype": "bf16",
                            "optimizer": "adam", "seq_length": 4096}
    assert cfg["model"]["num_key_value_heads"] == 8
    ddlsim.load_config(cfg)


def test_deepspeeds_batch_rule_derives_the_global_batch_or_refuses_a_mismatch(tmp_path):
    doc = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    cfg = import_config([_ds(tmp_path, doc)], system="dgx-h100", nodes=2,
                        overrides=("model.preset=llama-3-8b", "train.seq_length=2048")).config
    assert cfg["train"]["global_batch_size"] == 2 * 4 * 16
    doc["train_batch_size"] = 100
    with pytest.raises(ConfigError, match="is not train_micro_batch_size_per_gpu 2 × "
                                          "gradient_accumulation_steps: 4 × DP 16") as exc:
        import_config([_ds(tmp_path, doc)], system="dgx-h100", nodes=2,
                      overrides=("model.preset=llama-3-8b", "train.seq_length=2048"))
    assert "holds at" not in str(exc.value)   # 100 is no whole DP of 2 × 4
    doc["train_batch_size"] = 512   # 2 × 4 × DP 64: the nodes that give it are named
    with pytest.raises(ConfigError, match="it holds at DP 64: 64 GPUs, --nodes 8 at 8 a node"):
        import_config([_ds(tmp_path, doc)], system="dgx-h100", nodes=2,
                      overrides=("model.preset=llama-3-8b", "train.seq_length=2048"))


def test_set_section_name_takes_a_preset_as_predicts_set_does(tmp_path):
    """``--set model=NAME`` gives a section the sources leave out (a ds_config has no model)
    the preset, as ``predict --set`` does; ``system.preset=NAME`` still sets one key beside
    the launcher's nodes; a model the sources write out is not silently replaced."""
    doc = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    cfg = import_config([_ds(tmp_path, doc)], system="dgx-h100", nodes=2,
                        overrides=("model=llama-3-8b", "train.seq_length=2048")).config
    assert cfg["model"] == {"preset": "llama-3-8b"}
    assert ddlsim.load_config(cfg).model.num_hidden_layers == 32
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 "
                      "--hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                      "--max-position-embeddings 128 --micro-batch-size 1 "
                      "--global-batch-size 8 --bf16\n")
    got = import_config([script], overrides=("system.preset=dgx-a100",)).config
    assert got["system"]["preset"] == "dgx-a100" and got["system"]["nodes"] == 1
    with pytest.raises(ConfigError, match=r"override 'model=llama-3-8b': the config's model "
                                          r"section is written out in full"):
        import_config([script], system="dgx-h100", overrides=("model=llama-3-8b",))


def test_ds_config_keys_ddlsim_cannot_model_are_refused_by_name(tmp_path):
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
           "fp16": {"enabled": True, "loss_scale": 0}, "amp": {"enabled": True}}
    with pytest.raises(ConfigError) as exc:
        import_config([_ds(tmp_path, doc)], system="dgx-h100", nodes=2)
    assert "zero_optimization.offload_optimizer" in str(exc.value)
    assert "amp: not a ds_config key" in str(exc.value)


def test_torchtitan_llama3_8b_is_fsdp_as_zero3_with_the_global_batch_of_torchtitan():
    cfg = import_config([DATA / "torchtitan_llama3_8b.toml"], system="dgx-a100",
                        nodes=8).config
    assert cfg["model"] == "llama-3.1-8b"
    assert cfg["parallel"]["zero_stage"] == 3
    assert cfg["system"]["software"]["stack"] == "torchtitan-2025"
    assert cfg["train"]["global_batch_size"] == 1 * 64      # local batch × DP 64
    assert cfg["train"]["recompute"] == "full"
    ddlsim.load_config(cfg)


def test_torchtitan_import_round_trips_to_the_hand_written_config():
    """import → YAML → predict gives what the hand-written config of the same run gives."""
    imported = import_config([DATA / "torchtitan_llama3_8b.toml"], system="dgx-h100",
                             nodes=8).config
    hand = {"model": "llama-3.1-8b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 8192,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": 8, "software": "torchtitan-2025"}}
    a = ddlsim.predict(ddlsim.load_config(imported), check_fit=False)
    b = ddlsim.predict(ddlsim.load_config(hand), check_fit=False)
    assert a.iteration_time_s == b.iteration_time_s
    assert a.comm_bytes == b.comm_bytes


@pytest.mark.parametrize("old, new, path, value", [
    ("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2",
     ("parallel", "pipeline_model_parallel_size"), 2),
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = 2",
     ("parallel", "sequence_parallel"), True),
    ("compile = false", "compile = true", ("system", "software", "compile"), True),
    ("mode = 'full'", "mode = 'selective'\nselective_ac_option = 'op'",
     ("train", "recompute"), "selective"),
    ("mode = 'full'", "mode = 'selective'\nselective_ac_option = '2'",
     ("train", "recompute_every_n_layers"), 2),
    ("mode = 'full'", "mode = 'selective'\nselective_ac_option = '2'",
     ("train", "recompute"), "full"),
    ("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2",
     ("parallel", "data_parallel_replicate_size"), 2),
    ("[float8]", "[float8]\nrecipe_name = 'rowwise'",
     ("system", "software", "kernels", "fp8_recipe"), "rowwise"),
    ("[parallelism]", "[parallelism]\nfsdp_reshard_after_forward = 'never'",
     ("system", "software", "overlap", "zero3_reshard_after_forward"), "never"),
    ("context_parallel_degree = 1", "context_parallel_degree = 2",
     ("parallel", "cp_comm_type"), "all_gather"),
    ("context_parallel_degree = 1",
     "context_parallel_degree = 2\ncontext_parallel_rotate_method = 'alltoall'",
     ("parallel", "cp_comm_type"), "p2p"),
])
def test_torchtitan_fsdp_with_pp_tp_and_compile_are_imported(tmp_path, old, new, path, value):
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    assert old in text
    (tmp_path / "t.toml").write_text(text.replace(old, new, 1))
    cfg = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=8).config
    got = cfg
    for key in path:
        got = got[key]
    assert got == value
    assert cfg["parallel"]["zero_stage"] == 3


def test_torchtitan_async_tp_is_imported_and_needs_compile(tmp_path):
    text = (DATA / "torchtitan_llama3_8b.toml").read_text().replace(
        "tensor_parallel_degree = 1",
        "tensor_parallel_degree = 2\nenable_async_tensor_parallel = true", 1)
    (tmp_path / "t.toml").write_text(text)
    with pytest.raises(ConfigError, match="async_tp_needs_compile"):
        import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=8)
    (tmp_path / "t.toml").write_text(text.replace("compile = false", "compile = true"))
    cfg = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=8).config
    assert cfg["parallel"]["tp_comm_overlap"] == "torch_async"


def test_torchtitans_interleaved_schedule_takes_its_uneven_virtual_stages(tmp_path):
    """Interleaved1F1B on PP 2: four virtual stages; torchtitan 07c00d9 splits Llama 3 8B's
    32 layers with the embedding and the output as one layer each: 8, 9, 8, 7."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    text = text.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2\n"
                        "pipeline_parallel_schedule = 'Interleaved1F1B'", 1)
    (tmp_path / "t.toml").write_text(text.replace("batch_size = 1", "batch_size = 4", 1))
    p = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=2).config["parallel"]
    assert (p["schedule"], p["virtual_pipeline_model_parallel_size"]) == ("interleaved", 2)
    assert p["layers_per_virtual_stage"] == [8, 9, 8, 7]


def test_torchtitans_own_module_split_is_the_split_and_split_points_are_refused(tmp_path):
    """07c00d9: module_fqns_per_model_part lists each stage's modules; its deprecated
    pipeline_parallel_split_points raise there (models/llama3/infra/pipeline.py 41-45)."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    parts = [[f"layers.{i}" for i in range(a, b)] for a, b in ((0, 12), (12, 32))]
    given = text.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2\n"
                         f"module_fqns_per_model_part = {parts!r}", 1)
    (tmp_path / "t.toml").write_text(given)
    p = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=2).config["parallel"]
    assert p["layers_per_virtual_stage"] == [12, 20]
    (tmp_path / "t.toml").write_text(text.replace(
        "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2\n"
        "pipeline_parallel_split_points = ['layers.16']", 1))
    with pytest.raises(ConfigError, match="refuses pipeline_parallel_split_points"):
        import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=2)


@pytest.mark.parametrize("old, new, refused", [
    ("[float8]", "[float8]\nrecipe_name = 'rowwise_with_gw_hp'", "recipes: tensorwise"),
    ("mode = 'full'", "mode = 'selective'\nselective_ac_option = 'layer'",
     "'op' or a whole number"),
])
def test_torchtitan_settings_ddlsim_cannot_express_are_refused(tmp_path, old, new, refused):
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    assert old in text
    path = tmp_path / "t.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=refused):
        import_config([path], system="dgx-a100", nodes=8)


def test_a_hugging_face_model_folder_is_the_model_section(tmp_path):
    folder = tmp_path / "Llama-3.1-70B"
    folder.mkdir()
    shutil.copy(HF / "llama-3.1-70b.json", folder / "config.json")
    assert detect(folder) == "hf"
    cfg = import_config([folder], system="dgx-h100", nodes=8, overrides=(
        "train.micro_batch_size=1", "train.global_batch_size=64", "train.seq_length=4096",
        "parallel.tensor_model_parallel_size=8", "parallel.pipeline_model_parallel_size=4"
    )).config
    same = ddlsim.load_config(cfg).model
    bundled = ddlsim.load_config({**cfg, "model": "llama-3.1-70b"}).model
    assert same.shape() == bundled.shape()
    with pytest.raises(ConfigError, match="holds config.json"):
        import_config([tmp_path], kind="hf", system="dgx-h100", nodes=8)


def test_two_sources_that_disagree_are_refused(tmp_path):
    a = _ds(tmp_path, {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1})
    script = tmp_path / "m.sh"
    script.write_text("python pretrain_gpt.py --global-batch-size 128")
    with pytest.raises(ConfigError, match="train.global_batch_size: .* gives 64 and .* gives 128"):
        import_config([a, script], system="dgx-h100", nodes=2)


def test_megatron_deepspeed_script_and_its_ds_config_combine(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("deepspeed --num_gpus 8 --num_nodes 2 pretrain_gpt.py --num-layers 24 "
                      "--hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
                      "--max-position-embeddings 2048 --micro-batch-size 4 "
                      "--global-batch-size 512 --bf16 --deepspeed --deepspeed_config "
                      "ds.json --zero-stage 1\n")
    ds = _ds(tmp_path, {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1},
                        "bf16": {"enabled": True}})
    cfg = import_config([script, ds], system="dgx-h100").config
    assert cfg["system"]["software"] == "deepspeed" and cfg["system"]["nodes"] == 2
    assert cfg["parallel"]["zero_stage"] == 1
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="parallel.zero_stage: .* gives 1 and .* gives 2"):
        import_config([script, ds], system="dgx-h100")


def _float8_toml(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The 8B TOML converted to float8 (torchao tensorwise) with the FSDP float8 keys on,
    then ``edits``."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text().replace(
        'flavor = "8B"', 'flavor = "8B"\nconverters = ["float8"]', 1)
    for old, new in (("enable_fsdp_float8_all_gather = false",
                      "enable_fsdp_float8_all_gather = true"),
                     ("precompute_float8_dynamic_scale_for_fsdp = false",
                      "precompute_float8_dynamic_scale_for_fsdp = true"), *edits):
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_torchtitans_fsdp_float8_all_gather_is_the_stacks_field(tmp_path):
    imported = import_config([_float8_toml(tmp_path)], system="dgx-h100", nodes=1)
    kernels = imported.config["system"]["software"]["kernels"]
    assert kernels["enable_fsdp_float8_all_gather"] is True
    assert kernels["precompute_float8_dynamic_scale_for_fsdp"] is True
    assert imported.config["train"]["dtype"] == "fp8"


@pytest.mark.parametrize("edit, outcome", [
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1\n"
      "context_parallel_degree = 8"), "data_parallel_shard_degree > 1"),
    (('converters = ["float8"]', "converters = []"), "does not convert to float8"),
])
def test_fsdp_float8_keys_torchtitan_does_not_pass_on_are_noted(tmp_path, edit, outcome):
    text = _float8_toml(tmp_path, edit).read_text().replace("context_parallel_degree = 1\n", "")
    (tmp_path / "t.toml").write_text(text)
    imported = import_config([tmp_path / "t.toml"], system="dgx-h100", nodes=1)
    notes = [o for d in imported.drafts for a, o in d.notes if "fsdp_float8" in a]
    assert any(outcome in o for o in notes)
    assert "enable_fsdp_float8_all_gather" not in imported.config["system"]["software"].get(
        "kernels", {})


def test_fsdp_float8_all_gather_with_a_recipe_name_is_refused_as_torchtitan_does(tmp_path):
    path = _float8_toml(tmp_path, ("[float8]", "[float8]\nrecipe_name = 'tensorwise'"))
    with pytest.raises(ConfigError, match="refuses it with \\[float8\\] recipe_name"):
        import_config([path], system="dgx-h100", nodes=1)


def test_the_2024_405b_toml_gathers_in_float8(tmp_path):
    """torchtitan 9dec370 train_configs/llama3_405b.toml's [float8] section, in the 2024
    format (enable_float8_linear)."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text().replace(
        "enable_fsdp_float8_all_gather = false", "enable_float8_linear = true\n"
        "enable_fsdp_float8_all_gather = true").replace(
        "precompute_float8_dynamic_scale_for_fsdp = false",
        "precompute_float8_dynamic_scale_for_fsdp = true").replace(
        "[parallelism]", "[experimental]\npipeline_parallel_degree = 1\n[parallelism]")
    (tmp_path / "t.toml").write_text(text)
    imported = import_config([tmp_path / "t.toml"], system="dgx-h100", nodes=1)
    assert imported.config["system"]["software"]["stack"] == "torchtitan-2024"
    assert imported.config["system"]["software"]["kernels"][
        "enable_fsdp_float8_all_gather"] is True


def test_torchtitans_reshard_policy_without_fsdp_is_noted_unread_and_the_run_loads(tmp_path):
    """torchtitan passes ``fsdp_reshard_after_forward`` to ``apply_fsdp`` only: on a run without
    FSDP (shard degree 1, replicas alone: DDP) it sets nothing, so that ``ddlsim predict`` (which
    refuses a ``zero3_*`` field below ZeRO-3) takes the imported config."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text()
    text = text.replace("[parallelism]", "[parallelism]\nfsdp_reshard_after_forward = 'never'", 1)
    text = text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 8",
                        1).replace("data_parallel_shard_degree = -1",
                                   "data_parallel_shard_degree = 1", 1)
    (tmp_path / "t.toml").write_text(text)
    got = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=1)
    cfg = got.config
    assert cfg["parallel"].get("zero_stage", 0) == 0
    assert "zero3_reshard_after_forward" not in str(cfg)
    assert any("unread" in outcome for d in got.drafts for _arg, outcome in d.notes)
    ddlsim.load_config(cfg)


def test_torchtitans_interleaved_schedule_groups_micro_batches_in_torchs_rounds(tmp_path):
    """Interleaved1F1B on PP 4 with 10 micro-batches per pipeline: torch.distributed.pipelining
    runs two rounds of 5 (refused with Megatron's multiple-of-PP rule until 2026-12-01); 9
    micro-batches, two rounds that do not divide them, torch refuses, and so does the import."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text().replace(
        "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4\n"
        "pipeline_parallel_schedule = 'Interleaved1F1B'", 1)
    (tmp_path / "t.toml").write_text(text.replace("batch_size = 1", "batch_size = 10", 1))
    cfg = ddlsim.load_config(import_config([tmp_path / "t.toml"], system="dgx-a100",
                                           nodes=1).config)
    assert (cfg.num_microbatches, cfg.microbatch_group) == (10, 5)
    (tmp_path / "t.toml").write_text(text.replace("batch_size = 1", "batch_size = 9", 1))
    with pytest.raises(ConfigError, match="ScheduleInterleaved1F1B"):
        import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=1)


def test_torchtitans_schedule_name_is_read_whatever_its_case(tmp_path):
    """torch's get_schedule_class lower-cases the name (torchtitan 07c00d9's Llama 4 config
    writes "interleaved1f1b")."""
    text = (DATA / "torchtitan_llama3_8b.toml").read_text().replace(
        "pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2\n"
        "pipeline_parallel_schedule = 'interleaved1f1b'", 1)
    (tmp_path / "t.toml").write_text(text.replace("batch_size = 1", "batch_size = 4", 1))
    p = import_config([tmp_path / "t.toml"], system="dgx-a100", nodes=2).config["parallel"]
    assert p["schedule"] == "interleaved"


def test_a_ds_config_with_a_hf_model_says_which_model_code_the_stack_runs():
    """The ds_config implies the deepspeed stack (Megatron-DeepSpeed's model code); with a
    Hugging Face model and no --software the import says so once, in a warning and in the
    YAML's notes, with the --set values for transformers' code, which give it."""
    import warnings

    from ddlsim.errors import DDLSimWarning
    from ddlsim.importers import HF_MODEL_CODE
    args = ([DATA / "ds_zero3.json", HF / "llama-3.1-8b.json"],)
    kw = dict(system="dgx-h100", nodes=32, overrides=("train.seq_length=4096",))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        imported = import_config(*args, **kw)
    said = [str(w.message) for w in got if issubclass(w.category, DDLSimWarning)
            and "Megatron-DeepSpeed's model code" in str(w.message)]
    assert len(said) == 1 and all(f"--set {s}" in said[0] for s in HF_MODEL_CODE)
    notes = [n for d in imported.drafts for n in d.notes]
    assert ("ds_config with a Hugging Face model", said[0]) in notes
    cfg = import_config(*args, **{**kw, "overrides": kw["overrides"] + HF_MODEL_CODE}).config
    run = ddlsim.load_config(cfg)
    assert run.software.kernels["attention"] == "flash2"
    assert run.software.kernels["separate_projections"] is True
    # a stack named on the command line is the user's choice: nothing to say
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        import_config(*args, software="deepspeed", **kw)
    assert not [w for w in got if "Megatron-DeepSpeed's model code" in str(w.message)]
