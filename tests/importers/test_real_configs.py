"""``ddlsim import`` on the launch configs users run today, as their repositories ship them
(``data/real``, each file's repository, commit and path in ``data/real/SOURCES.md``).

Each row gives the import's options (what a user adds: the system, and ``--ignore``/``--set``
where the import asks for them) and either the fields the file sets, checked against the
file's own values, or the refusal, which must name the argument and why. docs/import.md's
table of real files is this table.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers import import_config

REAL = Path(__file__).with_name("data") / "real"

_H100 = {"system": "dgx-h100"}

#: file → (import options, {dotted field: the file's value})
IMPORTED = {
    # TP 8, PP 16, micro 1, global 1536 (the schedule's last step too), --fp16; GPT-2 BPE's
    # 50,257 tokens padded to 128 x TP 8
    "mlm__train_gpt3_175b_distributed.sh": (
        {"system": "dgx-a100", "nodes": 16},
        {"parallel.tensor_model_parallel_size": 8, "parallel.pipeline_model_parallel_size": 16,
         "train.micro_batch_size": 1, "train.global_batch_size": 1536, "train.seq_length": 2048,
         "model.num_hidden_layers": 96, "model.hidden_size": 12288,
         "model.num_attention_heads": 96, "model.architecture": "gpt", "train.dtype": "fp16",
         "model.vocab_size": 51200, "train.recompute": None, "parallel.zero_stage": None}),
    # DTYPE=fp8 branch: --fp8-format hybrid over --bf16; the MOCK data branch's --vocab-size
    # --fp8-param-gather: Megatron-Core 2025's (the 2024 stack has none: no_fp8_param_gather)
    "mlm__train_llama3_8b_h100_fp8.sh": (
        {**_H100, "software": "megatron-core-2025"},
        {"parallel.tensor_model_parallel_size": 1, "parallel.context_parallel_size": 1,
         "parallel.pipeline_model_parallel_size": None, "train.micro_batch_size": 1,
         "train.global_batch_size": 128, "train.seq_length": 8192,
         "model.num_hidden_layers": 32, "model.hidden_size": 4096,
         "model.intermediate_size": 14336, "model.num_key_value_heads": 8,
         "model.head_dim": 128, "model.architecture": "llama", "model.vocab_size": 128256,
         "train.dtype": "fp8", "parallel.zero_stage": 1, "parallel.overlap_param_gather": True,
         "system.software.kernels.fp8_param_gather": True,
         "parallel.sequence_parallel": None, "system.devices_per_node": 8, "system.nodes": 1}),
    "mlm__train_llama3_8b_fsdp_h100_fp8.sh": (
        # Megatron-FSDP's FP8 parameter gather is not modelled (param_gather.check_fp8): the
        # run is imported with its parameters gathered in bf16
        {**_H100, "ignore": ("use-nccl-ub", "fsdp-double-buffer", "fsdp-manual-registration"),
         "overrides": ("system.software.kernels.fp8_param_gather=false",)},
        {"parallel.zero_stage": 3, "system.software.overlap.zero3_implementation":
         "megatron_fsdp", "train.dtype": "fp8", "train.global_batch_size": 128,
         "train.seq_length": 8192, "model.num_hidden_layers": 32}),
    # Llama2Tokenizer: the vocabulary is the tokenizer's, given by the user
    "mlm__train_mixtral_8x7b_distributed.sh": (
        {**_H100, "nodes": 4, "ignore": ("tokenizer-type",),
         "overrides": ("model.vocab_size=32000",)},
        {"parallel.tensor_model_parallel_size": 1, "parallel.pipeline_model_parallel_size": 4,
         "parallel.expert_model_parallel_size": 8, "parallel.zero_stage": 1,
         "train.micro_batch_size": 1, "train.global_batch_size": 256, "train.seq_length": 4096,
         "model.num_local_experts": 8, "model.num_experts_per_tok": 2,
         "model.num_key_value_heads": 8, "train.dtype": "bf16",
         "parallel.moe.token_dispatcher_type": "alltoall",
         "system.software.kernels.attention": None}),     # --no-masked-softmax-fusion: TE's
    # Megatron-DeepSpeed's own flags: --num-key-value-heads, --use-rotary-position-embeddings,
    # --normalization rmsnorm; its heredoc ds_config skipped, its if-blocks decided
    "mds__pretrain_llama2_distributed.sh": (
        {**_H100, "ignore": ("tokenizer-type",), "overrides": ("model.vocab_size=32000",)},
        {"parallel.tensor_model_parallel_size": 2, "parallel.pipeline_model_parallel_size": 2,
         "parallel.zero_stage": 0, "train.micro_batch_size": 4, "train.global_batch_size": 32,
         "train.seq_length": 2048, "model.num_hidden_layers": 24, "model.hidden_size": 2048,
         "model.intermediate_size": 5504, "model.num_attention_heads": 16,
         "model.num_key_value_heads": 4, "model.architecture": "llama", "train.dtype": "bf16",
         "train.recompute": None, "system.software": "deepspeed"}),
    "mds__ds_zero_stage_1_config_baseline.json": (
        {**_H100, "nodes": 8, "overrides": ("model.preset=llama-3.1-8b", "train.seq_length=2048",
                                            "train.micro_batch_size=8")},
        {"parallel.zero_stage": 1, "train.global_batch_size": 512, "train.dtype": "fp16",
         "system.software": "deepspeed"}),
    "dse__training_pipeline_parallelism_ds_config.json": (
        {**_H100, "nodes": 4, "overrides": ("model.preset=llama-3.1-8b",
                                            "train.seq_length=2048")},
        {"train.global_batch_size": 256, "train.micro_batch_size": 8,
         "train.optimizer": "adam"}),
    # "auto" (the HF Trainer's): given by the user
    "dse__training_autotuning_hf_dsconfigs_ds_config_fp16_z3.json": (
        {**_H100, "nodes": 1, "overrides": ("model.preset=llama-3.1-8b", "train.seq_length=2048",
                                            "train.micro_batch_size=2",
                                            "train.global_batch_size=16")},
        {"parallel.zero_stage": 3, "train.dtype": "fp16", "train.micro_batch_size": 2}),
    "titan__llama3_8b.toml": (
        {**_H100, "nodes": 8},
        {"model": "llama-3.1-8b", "train.micro_batch_size": 1, "train.global_batch_size": 64,
         "train.seq_length": 8192, "parallel.zero_stage": 3, "train.recompute": "selective",
         "parallel.tensor_model_parallel_size": 1, "system.software.stack": "torchtitan-2025",
         "system.software.compile": None}),
    "titan__llama3_70b.toml": (
        {**_H100, "nodes": 8},
        {"model": "llama-3.1-70b", "train.micro_batch_size": 8, "train.global_batch_size": 64,
         "parallel.tensor_model_parallel_size": 8, "parallel.sequence_parallel": True,
         "train.recompute": "full", "parallel.zero_stage": 3}),
    # torchtitan's qwen3 32B flavor: Qwen3-32B's shape in every dimension (qwen3-32b preset,
    # test_torchtitan_flavors.py); FSDP over all ranks, full AC, local batch 2 x DP 32
    "titan__qwen3_32b.toml": (
        {**_H100, "nodes": 4},
        {"model": "qwen3-32b", "train.micro_batch_size": 2, "train.global_batch_size": 64,
         "train.seq_length": 4096, "parallel.zero_stage": 3, "train.recompute": "full",
         "system.software.stack": "torchtitan-2025"}),
    # followed into the checkout (zoo__repo: sbatch_benchmarking.sh, runtime.conf, the model
    # YAML); refused by name: the tokenizer (its vocabulary given), TE's CUDA graphs
    # (test_modelzoo.py has the whole check)
    "zoo__run_h100_235b.sh": (
        {**_H100, "software": "megatron-core-2025", "repo": REAL / "zoo__repo",
         "ignore": ("tokenizer-type", "cuda-graph-impl", "cuda-graph-scope"),
         "overrides": ("model.vocab_size=151936",)},
        {"parallel.tensor_model_parallel_size": 2, "parallel.pipeline_model_parallel_size": 8,
         "parallel.virtual_pipeline_model_parallel_size": 4,
         "parallel.expert_model_parallel_size": 32, "parallel.expert_tensor_parallel_size": 1,
         "train.micro_batch_size": 1, "train.global_batch_size": 2048,
         "parallel.moe.token_dispatcher_type": "flex",
         "parallel.moe.flex_dispatcher_backend": "deepep",
         "parallel.moe.overlap_expert_parallel_comm": True, "train.recompute": "selective",
         "train.recompute_modules": ["moe_act", "layernorm"], "system.nodes": 32,
         "model.num_hidden_layers": 94, "model.qk_norm": True}),
    # the ModelZoo's model YAMLs of MLA models, read with the launcher's variables given
    # (--env) and the tokenizer's vocabulary (DeepSeek-V3's config.json: 129,280; Kimi-K2's:
    # 163,840); MLA, --moe-layer-freq and the shared experts (importers/megatron_moe_model.py;
    # test_megatron_mla.py has the model against the deepseek-v3 preset)
    **{name: ({**_H100, "software": "megatron-core-2025", "nodes": 32, "env": tuple(
        f"{k}={v}" for k, v in {"TP": 2, "PP": 8, "EP": 32, "CP": 1, "VPP": 1, "MBS": 1,
                                "GBS": 1024, "SEQ_LEN": 4096, "NUM_LAYERS": 61, "PP_FIRST": 7,
                                "PP_LAST": 6}.items()),
        "ignore": ("tokenizer-type",), "overrides": (f"model.vocab_size={vocab}",)},
        {"model.num_hidden_layers": 61, "model.hidden_size": 7168,
         "model.num_attention_heads": heads, "model.num_local_experts": experts,
         "model.q_lora_rank": 1536, "model.kv_lora_rank": 512, "model.qk_nope_head_dim": 128,
         "model.qk_rope_head_dim": 64, "model.v_head_dim": 128,
         "model.first_k_dense_replace": dense, "model.n_shared_experts": 1,
         "model.shared_expert_intermediate_size": 2048, "model.qk_norm": None,
         "parallel.tensor_model_parallel_size": 2, "parallel.expert_model_parallel_size": 32,
         "parallel.sequence_parallel": True, "parallel.moe.router_enable_expert_bias": True})
       for name, vocab, heads, experts, dense in (
           ("zoo__DeepSeek-V3.yaml", 129280, 128, 256, 3),
           ("zoo__Kimi-K2.yaml", 163840, 64, 384, 1))},
    # converters = ["float8"] is refused (below); without it: bf16, compiled, async TP
    "titan__llama3_405b.toml": (
        {**_H100, "nodes": 16, "ignore": ("[model]",)},
        {"model": "llama-3.1-405b", "train.dtype": "bf16", "train.micro_batch_size": 2,
         "parallel.tensor_model_parallel_size": 8, "system.software.compile": True,
         "parallel.tp_comm_overlap": "torch_async", "train.recompute": "full"}),
}

#: file → (import options, what the refusal must say)
REFUSED = {
    "mlm__02_train.sh": (_H100, r"loops or branches by 'while \[\[ \$# -gt 0 \]\]'"),
    "mds__ds_pretrain_gpt_1.3B.sh": (_H100, r"loops or branches by 'for \(\("),
    "mds__run_bf16.sh": (_H100, r"loops or branches by 'while"),
    "mlm__train_mixtral_8x7b_distributed.sh": (
        _H100, r"--tokenizer-type Llama2Tokenizer: ddlsim cannot read a tokenizer.*"
               r"--ignore tokenizer-type --set model.vocab_size=N"),
    "mlm__train_llama3_8b_fsdp_h100_fp8.sh": (
        {**_H100, "ignore": ("use-nccl-ub", "fsdp-double-buffer", "fsdp-manual-registration")},
        r"fp8_param_gather = true needs the distributed optimizer.*zero_stage = 3"),
    "mds__universal_checkpointing_ds_config.json": (
        _H100, r"data_types: \{'grad_accum_dtype': 'fp32'\}: the gradients' accumulation "
               r"dtype"),
    "dse__training_tensor_parallel_hf_integration_configs_ds_config.json": (
        _H100, r"bf16.enabled: auto: expects true or false \('auto' is the HF Trainer's.*"
               r"--ignore bf16.enabled.*tensor_parallel: \{'autotp_size': 4\}: DeepSpeed's "
               r"AutoTP"),
    "dse__training_imagenet_config_ds_config.json": (
        _H100, r"cuda_visible_devices: not a ds_config key ddlsim reads"),
    "titan__llama3_405b.toml": (
        _H100, r"\[model\] converters = 'float8': .*'quantize.linear.float8'.*KeyError"),
    "titan__deepseek_v3_16b.toml": (
        _H100, r"name = 'deepseek_v3', flavor = '16B': torchtitan runs this flavor's attention "
               r"as FlexAttention with attn_mask_type 'block_causal'.*"
               r"expert_tensor_parallel_degree = 1: not a key.*"
               r"\[compile\] enable = true, components = \['loss'\]: ddlsim models the "
               r"compiled TransformerBlocks"),
    "zoo__run_h100_235b.sh": (
        _H100, r"it runs ./sbatch_benchmarking.sh, which builds the Megatron-LM command from "
               r"the ModelZoo's files; give the checkout it runs in with --repo FOLDER"),
}


def _field(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@pytest.mark.parametrize("name", sorted(IMPORTED))
def test_a_real_config_imports_with_the_files_values(name):
    options, expected = IMPORTED[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the not-modelled arguments' warning
        config = import_config([REAL / name], **options).config
    got = {k: _field(config, k) for k in expected}
    assert got == expected
    ddlsim.load_config(config)              # and loads as predict loads it


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_real_config_is_refused_naming_the_argument(name):
    options, message = REFUSED[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match=message):
            import_config([REAL / name], **options)


def test_every_real_file_is_in_the_table_and_its_sources():
    files = {p.name for p in REAL.iterdir() if p.is_file() and p.name != "SOURCES.md"}
    assert files == set(IMPORTED) | set(REFUSED)
    sources = (REAL / "SOURCES.md").read_text()
    checkout = {p.relative_to(REAL).as_posix() for p in (REAL / "zoo__repo").rglob("*")
                if p.is_file()}
    assert all(f"| {f} |" in sources for f in files | checkout)
