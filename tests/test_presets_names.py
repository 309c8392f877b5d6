"""Model presets under the names users type, and ``--set SECTION.preset=NAME``."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

RUN = {"parallel": {"tensor_model_parallel_size": 8},
       "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
       "system": {"preset": "dgx-a100", "nodes": 2}}


@pytest.mark.parametrize("name, params", [
    ("llama-3-8b", 8030261248), ("meta-llama-3-8b", 8030261248),
    ("llama-3-70b", 70553706496), ("llama-3.1-8b", 8030261248),
    ("llama-3.1-70b", 70553706496), ("llama-3.1-405b", 405853388800),
    ("meta-llama-3.1-405b", 405853388800), ("llama-2-70b", 68976648192),
    ("meta-llama/Meta-Llama-3-70B", 70553706496), ("meta-llama/Llama-2-7b-hf", 6738415616),
    ("mistralai/Mistral-7B-v0.1", 7241732096), ("gpt2", 124439808),
    ("openai-community/gpt2-xl", 1557611200),
    ("meta-llama/Llama-3.1-8B-Instruct", 8030261248), ("Llama-2-7b-chat-hf", 6738415616),
])
def test_the_names_users_guess_resolve_to_the_published_shapes(name, params):
    cfg = ddlsim.load_config({**RUN, "model": name, "parallel": {}},
                             overrides=["train.seq_length=1024"])
    assert cfg.model.shape().params == params


def test_an_unknown_model_name_is_still_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean"):
        ddlsim.load_config({**RUN, "model": "llama-3-7b"})


def test_set_system_preset_keeps_the_nodes_the_config_gave():
    cfg = ddlsim.load_config({**RUN, "model": "llama-3-8b"},
                             overrides=["system.preset=dgx-h100"])
    assert cfg.system.name == "dgx-h100" and cfg.system.nodes == 2
    assert cfg.system.device.name.startswith("H100")
    both = ddlsim.load_config({**RUN, "model": "llama-3-8b"},
                              overrides=["system.nodes=4", "system.preset=dgx-h100"])
    assert both.system.nodes == 4


def test_set_system_preset_on_a_system_written_in_full_is_refused():
    from ddlsim.presets import get_preset
    full = {**RUN, "model": "llama-3-8b", "system": {**get_preset("system", "dgx-a100"),
                                                     "nodes": 2}}
    with pytest.raises(ConfigError, match="written out in full"):
        ddlsim.load_config(full, overrides=["system.preset=dgx-h100"])
    with pytest.raises(ConfigError, match="two system presets"):
        ddlsim.load_config({**RUN, "model": "llama-3-8b"},
                           overrides=["system.preset=dgx-h100", "system.preset=dgx-a100"])


def test_set_model_preset_replaces_a_model_read_from_its_hf_config():
    """A model section that names its Hugging Face config.json (the bundled Llama-2 70B
    example's) is replaced by ``--set model=NAME``, keeping the keys beside the source
    (not its name); one written out in full is still refused, name or not."""
    from pathlib import Path

    from ddlsim.configpresets import preset_overrides
    from ddlsim.presets import SECTIONS

    example = Path(__file__).resolve().parents[1] / "examples" / "llama2-70b-64-h100.yaml"
    cfg = ddlsim.load_config(example, ["model=llama-3-70b"])
    assert cfg.model.vocab_size == 128256 and cfg.model.num_hidden_layers == 80
    data = {**RUN, "model": {"hf_config": "x/config.json", "name": "mine",
                             "max_position_embeddings": 32768}}
    swapped, _ = preset_overrides(data, ["model=llama-3-8b"], SECTIONS)
    assert swapped["model"] == {"preset": "llama-3-8b", "max_position_embeddings": 32768}
    full = {**RUN, "model": {"name": "llama", "architecture": "llama", "num_hidden_layers": 2}}
    with pytest.raises(ConfigError, match="written out in full"):
        preset_overrides(full, ["model=llama-3-8b"], SECTIONS)


def test_sweep_over_system_presets():
    frame = ddlsim.sweep({**RUN, "model": "llama-3-8b"},
                         {"system.preset": ["dgx-a100", "dgx-h100"]})
    assert list(frame["system.preset"]) == ["dgx-a100", "dgx-h100"]
    assert frame["valid"].all()
    assert frame["iteration_time_s"].iloc[1] < frame["iteration_time_s"].iloc[0]


def test_foreign_names_say_what_they_are_in_ddlsim():
    with pytest.raises(ConfigError) as exc:
        ddlsim.load_config({**RUN, "model": "llama-3-8b", "zero_optimization": {"stage": 1},
                            "parallel": {"use_distributed_optimizer": True,
                                         "num_layers_per_virtual_pipeline_stage": 2}})
    text = str(exc.value)
    assert "parallel.zero_stage: 1 (Megatron's distributed optimizer shards" in text
    assert "virtual_pipeline_model_parallel_size = layers / PP / L" in text
    assert "`ddlsim import ds_config.json`" in text


def test_a_hugging_face_model_folder_is_read_where_a_config_json_is(tmp_path):
    import shutil
    from pathlib import Path
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    shutil.copy(Path(ddlsim.__file__).parent / "data" / "hf" / "llama-3.1-8b.json",
                folder / "config.json")
    by_option = ddlsim.load_config({**RUN, "model": "gpt2-124m"}, model=folder)
    by_key = ddlsim.load_config({**RUN, "model": {"hf_config": str(folder)}})
    assert by_option.model.shape() == by_key.model.shape()
    assert by_key.model.shape().params == 8030261248 and by_key.model.name == "Llama-3.1-8B"


def test_a_ds_config_given_as_a_run_config_is_told_once():
    with pytest.raises(ConfigError) as exc:
        ddlsim.load_config({"train_batch_size": 64, "zero_optimization": {"stage": 3},
                            "bf16": {"enabled": True}})
    text = str(exc.value)
    assert text.count("ddlsim import ds_config.json") == 1
    assert "'train_batch_size', 'zero_optimization', 'bf16': they are DeepSpeed" in text


@pytest.mark.parametrize("override, path", [
    ("parallel.tp=4", "parallel.tensor_model_parallel_size"),
    ("parallel.ep=8", "parallel.expert_model_parallel_size"),
    ("train.gbs=64", "train.global_batch_size"),
    ("train.precision=bf16", "train.dtype"),
    ("system.gpus_per_node=4", "system.devices_per_node"),
])
def test_short_names_users_type_point_at_the_field(override, path):
    """``gpus_per_node`` was answered "did you mean 'nics_per_node'?"."""
    with pytest.raises(ConfigError) as exc:
        ddlsim.load_config({**RUN, "model": "llama-3-8b"}, overrides=[override])
    key = override.split("=")[0].rsplit(".", 1)[1]
    assert f"'{key}' is written {path}" in str(exc.value)
    assert "did you mean" not in str(exc.value)
