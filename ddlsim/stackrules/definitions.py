"""The named stack rules: each a predicate over :class:`~.facts.PlanFacts`, true where a
framework refuses the plan, registered by :func:`~.facts.stack_rule` on import.

Each predicate is written once with numpy operators, so it runs on one plan (0-d arrays)
and on the search's arrays alike. Sources live beside each stack in software.yaml.
"""

from __future__ import annotations

from .facts import PlanFacts, stack_rule


@stack_rule("no_distributed_optimizer", "ZeRO-1/2 (it has no distributed optimizer)",
            "parallel.zero_stage")
def _no_distributed_optimizer(f: PlanFacts):
    return (f.zero == 1) | (f.zero == 2)


@stack_rule("distributed_optimizer_is_zero1",
            "ZeRO-2 (its distributed optimizer shards the optimizer state, not the gradients)",
            "parallel.zero_stage")
def _distributed_optimizer_is_zero1(f: PlanFacts):
    return f.zero == 2


@stack_rule("pipeline_zero", "ZeRO-2/3 with pipeline parallelism",
            "parallel.zero_stage", "parallel.pipeline_model_parallel_size")
def _pipeline_zero(f: PlanFacts):
    return (f.pp > 1) & (f.zero >= 2)


@stack_rule("pipeline_1f1b_only", "a schedule other than 1F1B (GPipe at any PP: each "
            "micro-batch's backward follows its forward)",
            "parallel.schedule", "parallel.pipeline_model_parallel_size")
def _pipeline_1f1b_only(f: PlanFacts):
    return ~f.one_f_one_b


@stack_rule("no_gpipe", "the GPipe schedule (all forwards, then all backwards; its schedules "
            "are 1F1B and interleaved 1F1B)", "parallel.schedule")
def _no_gpipe(f: PlanFacts):
    return ~f.one_f_one_b & ~f.interleaved


@stack_rule("interleaved_needs_pp3", "the interleaved schedule with PP <= 2",
            "parallel.schedule", "parallel.pipeline_model_parallel_size")
def _interleaved_needs_pp3(f: PlanFacts):
    return f.interleaved & (f.pp <= 2)


@stack_rule("interleaved_blocking_needs_pp3",
            "the interleaved schedule with PP <= 2 and overlap_p2p_comm off",
            "parallel.schedule", "parallel.pipeline_model_parallel_size",
            "parallel.overlap_p2p_comm")
def _interleaved_blocking_needs_pp3(f: PlanFacts):
    return f.interleaved & (f.pp <= 2) & ~f.p2p_overlap


@stack_rule("zero_needs_fp16", "ZeRO-1/2/3 in another precision than fp16",
            "parallel.zero_stage", "train.dtype")
def _zero_needs_fp16(f: PlanFacts):
    return (f.zero >= 1) & ~f.fp16


@stack_rule("no_fp8", "FP8 training (it has no FP8 code)", "train.dtype")
def _no_fp8(f: PlanFacts):
    return f.fp8


@stack_rule("no_param_gather_overlap", "ZeRO-1/2 with the parameter all-gather overlapped "
            "(overlap_param_gather: it gathers the updated parameters inside its step)",
            "parallel.overlap_param_gather", "parallel.zero_stage")
def _no_param_gather_overlap(f: PlanFacts):
    return ((f.zero == 1) | (f.zero == 2)) & f.param_gather_overlap


@stack_rule("no_selective_recompute", "selective recomputation (full recomputation only)",
            "train.recompute")
def _no_selective_recompute(f: PlanFacts):
    return f.selective


@stack_rule("no_sequence_parallel", "sequence parallelism", "parallel.sequence_parallel")
def _no_sequence_parallel(f: PlanFacts):
    return f.sp


@stack_rule("no_tensor_parallel", "tensor parallelism", "parallel.tensor_model_parallel_size")
def _no_tensor_parallel(f: PlanFacts):
    return f.tp > 1


@stack_rule("no_pipeline_parallel", "pipeline parallelism",
            "parallel.pipeline_model_parallel_size")
def _no_pipeline_parallel(f: PlanFacts):
    return f.pp > 1


@stack_rule("tp_needs_sp", "tensor parallelism without sequence parallelism",
            "parallel.tensor_model_parallel_size", "parallel.sequence_parallel")
def _tp_needs_sp(f: PlanFacts):
    return (f.tp > 1) & ~f.sp


@stack_rule("no_context_parallel", "context parallelism (ring or all-gather attention)",
            "parallel.context_parallel_size")
def _no_context_parallel(f: PlanFacts):
    return f.cp > 1


@stack_rule("zero3_pipeline", "ZeRO-3 with pipeline parallelism",
            "parallel.zero_stage", "parallel.pipeline_model_parallel_size")
def _zero3_pipeline(f: PlanFacts):
    # Megatron-FSDP under pipelining: not modelled (decoder/megatron_fsdp.py says so)
    return (f.pp > 1) & (f.zero == 3) & ~f.megatron_fsdp


@stack_rule("no_zero3", "ZeRO-3 (nothing in it shards the parameters: no FSDP of its own or "
            "of PyTorch's)", "parallel.zero_stage")
def _no_zero3(f: PlanFacts):
    return f.zero == 3


@stack_rule("no_zero12", "ZeRO-1/2 (its data parallelism is FSDP, i.e. ZeRO-3, or DDP)",
            "parallel.zero_stage")
def _no_zero12(f: PlanFacts):
    return (f.zero == 1) | (f.zero == 2)


@stack_rule("async_tp_needs_compile", "asynchronous TP without torch.compile",
            "parallel.tp_comm_overlap", "system.software.kernels.compile")
def _async_tp_needs_compile(f: PlanFacts):
    return (f.tp > 1) & f.tp_overlap & ~f.compiled


@stack_rule("async_tp_is_torchs", "TransformerEngine's userbuffers TP overlap (tp_comm_overlap "
            "bulk or pipelined; this stack's async TP is torch_async)",
            "parallel.tp_comm_overlap")
def _async_tp_is_torchs(f: PlanFacts):
    return (f.tp > 1) & f.te_tp_overlap


@stack_rule("no_te_tp_overlap", "TransformerEngine's userbuffers TP overlap (tp_comm_overlap "
            "bulk or pipelined)", "parallel.tp_comm_overlap")
def _no_te_tp_overlap(f: PlanFacts):
    return (f.tp > 1) & f.te_tp_overlap


@stack_rule("no_torch_compile", "torch.compile of the model (system.software.kernels.compile)",
            "system.software.kernels.compile")
def _no_torch_compile(f: PlanFacts):
    return f.compiled


@stack_rule("no_cuda_graphs", "CUDA-graph capture of the training step "
            "(system.software.kernels.host_dispatch cuda_graphs)",
            "system.software.kernels.host_dispatch")
def _no_cuda_graphs(f: PlanFacts):
    return f.cuda_graphs


@stack_rule("no_torch_async_tp", "PyTorch's symmetric-memory async TP (tp_comm_overlap "
            "torch_async; this stack's TP overlap, if any, is its own)",
            "parallel.tp_comm_overlap")
def _no_torch_async_tp(f: PlanFacts):
    return (f.tp > 1) & f.torch_tp_overlap


@stack_rule("moe_ep_divides_dp", "expert parallelism that does not divide data parallelism "
            "(EP is carved out of DP alone)",
            "parallel.expert_model_parallel_size", "parallel.data_parallel_size")
def _moe_ep_divides_dp(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.dp % f.ep != 0)


@stack_rule("moe_ep_no_context_parallel", "expert parallelism with context parallelism",
            "parallel.expert_model_parallel_size", "parallel.context_parallel_size")
def _moe_ep_no_context_parallel(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.cp > 1)


@stack_rule("no_cp_all_gather", "context parallelism that all-gathers K/V (cp_comm_type all_gather)",
            "parallel.cp_comm_type", "parallel.context_parallel_size")
def _no_cp_all_gather(f: PlanFacts):
    return (f.cp > 1) & f.cp_all_gather


@stack_rule("no_expert_tensor_parallel", "an expert tensor-parallel size other than TP",
            "parallel.expert_tensor_parallel_size", "parallel.tensor_model_parallel_size")
def _no_expert_tensor_parallel(f: PlanFacts):
    return f.moe & (f.etp != f.tp)


@stack_rule("no_every_nth_layer_recompute", "checkpointing of every n-th layer only "
            "(torchtitan's selective_ac_option = 'n')", "train.recompute_every_n_layers")
def _no_every_nth_layer_recompute(f: PlanFacts):
    return f.layer_ac


@stack_rule("no_per_virtual_stage_split", "a layer count given for each virtual pipeline "
            "stage", "parallel.layers_per_virtual_stage")
def _no_per_virtual_stage_split(f: PlanFacts):
    return f.given_split


@stack_rule("no_megatron_uneven_split", "Megatron-Core's uneven pipeline split options "
            "(account_for_embedding/loss_in_pipeline_split, num_layers_in_first/last_"
            "pipeline_stage)", "parallel.account_for_embedding_in_pipeline_split",
            "parallel.account_for_loss_in_pipeline_split",
            "parallel.num_layers_in_first_pipeline_stage",
            "parallel.num_layers_in_last_pipeline_stage")
def _no_megatron_uneven_split(f: PlanFacts):
    return f.megatron_uneven


@stack_rule("no_pipeline_layout", "Megatron-Core's pipeline layout string",
            "parallel.pipeline_model_parallel_layout")
def _no_pipeline_layout(f: PlanFacts):
    return f.layout_split


@stack_rule("no_hsdp", "HSDP (replicas of FSDP shards)", "parallel.data_parallel_replicate_size")
def _no_hsdp(f: PlanFacts):
    return f.hsdp


@stack_rule("moe_tp_needs_sp", "MoE layers with tensor parallelism but no sequence "
            "parallelism", "parallel.tensor_model_parallel_size", "parallel.sequence_parallel")
def _moe_tp_needs_sp(f: PlanFacts):
    return f.moe & (f.tp > 1) & ~f.sp


_A2A = "parallel.moe.overlap_expert_parallel_comm"


@stack_rule("no_ep_a2a_overlap", "the expert-parallel all-to-all overlap or delayed weight "
            "gradients (it has neither option)", _A2A, "parallel.moe.delay_wgrad_compute")
def _no_ep_a2a_overlap(f: PlanFacts):
    return f.a2a_overlap | f.delay_wgrad


@stack_rule("ep_a2a_overlap_needs_ep", "the expert-parallel all-to-all overlap without expert "
            "parallelism", _A2A, "parallel.expert_model_parallel_size")
def _ep_a2a_overlap_needs_ep(f: PlanFacts):
    return f.a2a_overlap & (f.ep <= 1)


@stack_rule("ep_a2a_overlap_dispatcher", "the expert-parallel all-to-all overlap with the "
            "allgather dispatcher (alltoall or flex only)", _A2A,
            "parallel.moe.token_dispatcher_type")
def _ep_a2a_overlap_dispatcher(f: PlanFacts):
    return f.a2a_overlap & f.allgather_dispatch


@stack_rule("ep_a2a_overlap_schedule", "the expert-parallel all-to-all overlap outside the "
            "interleaved schedule with PP > 1, or with GPipe", _A2A, "parallel.schedule",
            "parallel.pipeline_model_parallel_size")
def _ep_a2a_overlap_schedule(f: PlanFacts):
    return f.a2a_overlap & ~f.interleaved & ((f.pp > 1) | ~f.one_f_one_b)


@stack_rule("ep_a2a_overlap_no_full_recompute", "the expert-parallel all-to-all overlap with "
            "full recomputation", _A2A, "train.recompute")
def _ep_a2a_overlap_no_full_recompute(f: PlanFacts):
    return f.a2a_overlap & f.full_recompute


@stack_rule("ep_a2a_overlap_16bit", "the expert-parallel all-to-all overlap with an fp32 model "
            "(bf16 or fp16 only)", _A2A, "train.dtype")
def _ep_a2a_overlap_16bit(f: PlanFacts):
    return f.a2a_overlap & f.fp32


@stack_rule("ep_a2a_overlap_no_shared_expert_overlap", "the expert-parallel all-to-all overlap "
            "with shared_expert_overlap", _A2A, "parallel.moe.shared_expert_overlap")
def _ep_a2a_overlap_no_shared_expert_overlap(f: PlanFacts):
    return f.a2a_overlap & f.shared_overlap


@stack_rule("delay_wgrad_needs_ep_a2a_overlap", "delay_wgrad_compute without the "
            "expert-parallel all-to-all overlap", "parallel.moe.delay_wgrad_compute", _A2A)
def _delay_wgrad_needs_ep_a2a_overlap(f: PlanFacts):
    return f.delay_wgrad & ~f.a2a_overlap


@stack_rule("no_flex_dispatcher", "the flex token dispatcher (DeepEP/HybridEP kernels)",
            "parallel.moe.token_dispatcher_type")
def _no_flex_dispatcher(f: PlanFacts):
    return f.flex_dispatch


@stack_rule("flex_needs_tp_ep", "the flex token dispatcher on one rank (expert TP x EP = 1)",
            "parallel.moe.token_dispatcher_type", "parallel.expert_model_parallel_size",
            "parallel.expert_tensor_parallel_size")
def _flex_needs_tp_ep(f: PlanFacts):
    return f.flex_dispatch & (f.ep * f.etp <= 1)


@stack_rule("deepep_no_pad", "the flex dispatcher's DeepEP backend with padding to capacity",
            "parallel.moe.flex_dispatcher_backend", "parallel.moe.pad_expert_input_to_capacity")
def _deepep_no_pad(f: PlanFacts):
    return f.flex_dispatch & f.deepep & f.pad


_IMPL = "system.software.overlap.zero3_implementation"


@stack_rule("zero3_no_expert_parallel", "ZeRO-3 as PyTorch FSDP2 with expert parallelism "
            "(Megatron-FSDP, zero3_implementation megatron_fsdp, shards experts)",
            "parallel.zero_stage", "parallel.expert_model_parallel_size", _IMPL)
def _zero3_no_expert_parallel(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.zero == 3) & ~f.megatron_fsdp


@stack_rule("no_megatron_fsdp", "Megatron-Core's Megatron-FSDP (zero3_implementation "
            "megatron_fsdp)", _IMPL)
def _no_megatron_fsdp(f: PlanFacts):
    return f.megatron_fsdp


@stack_rule("fsdp2_no_grad_accum_fusion", "ZeRO-3 as PyTorch FSDP2 with gradient "
            "accumulation fusion", "parallel.zero_stage", _IMPL,
            "system.software.kernels.gradient_accumulation_fusion")
def _fsdp2_no_grad_accum_fusion(f: PlanFacts):
    return (f.zero == 3) & ~f.megatron_fsdp & f.grad_accum_fusion


@stack_rule("fsdp2_no_fp16", "ZeRO-3 as PyTorch FSDP2 in fp16", "parallel.zero_stage", _IMPL,
            "train.dtype")
def _fsdp2_no_fp16(f: PlanFacts):
    return (f.zero == 3) & ~f.megatron_fsdp & f.fp16


@stack_rule("fsdp2_needs_untied_embeddings", "ZeRO-3 as PyTorch FSDP2 with the output layer "
            "tied to the input embedding", "parallel.zero_stage", _IMPL,
            "model.tie_word_embeddings")
def _fsdp2_needs_untied_embeddings(f: PlanFacts):
    return (f.zero == 3) & ~f.megatron_fsdp & f.tied


@stack_rule("megatron_fsdp_no_grad_accum_fusion", "Megatron-FSDP with gradient accumulation "
            "fusion", _IMPL, "system.software.kernels.gradient_accumulation_fusion")
def _megatron_fsdp_no_grad_accum_fusion(f: PlanFacts):
    return f.megatron_fsdp & (f.zero == 3) & f.grad_accum_fusion


@stack_rule("no_recompute_modules", "Megatron-Core's selective recomputation by module "
            "(train.recompute_modules)", "train.recompute_modules")
def _no_recompute_modules(f: PlanFacts):
    return f.recompute_modules


@stack_rule("recompute_norm_act_not_delayed_fp8", "recomputation of moe_act or layernorm "
            "under FP8 delayed scaling", "train.recompute_modules", "train.dtype")
def _recompute_norm_act_not_delayed_fp8(f: PlanFacts):
    return f.norm_act_recompute & f.fp8_delayed


#: FP8 recipes a stack's code may lack: the rule, what it refuses and the :class:`PlanFacts`
#: field that is true for a plan running that recipe (each rule refuses exactly its fact)
_FP8_RECIPE_RULES = (
    ("no_te_current_scaling", "FP8 with Transformer Engine's current scaling "
     "(system.software.kernels.fp8_recipe te_current)", "fp8_current"),
    ("no_transformer_engine_fp8", "FP8 through Transformer Engine's recipes "
     "(system.software.kernels.fp8_recipe te_delayed or te_current)", "fp8_te"),
    ("no_torchao_float8", "FP8 through torchao's Float8Linear "
     "(system.software.kernels.fp8_recipe tensorwise or rowwise)", "fp8_torchao"),
    ("no_torchao_rowwise", "FP8 with torchao's rowwise scaling "
     "(system.software.kernels.fp8_recipe rowwise)", "fp8_rowwise"),
)
for _name, _reason, _fact in _FP8_RECIPE_RULES:
    stack_rule(_name, _reason, "system.software.kernels.fp8_recipe", "train.dtype")(
        lambda f, fact=_fact: getattr(f, fact))


@stack_rule("recompute_shared_experts_no_overlap", "recomputation of the shared experts with "
            "shared_expert_overlap", "train.recompute_modules", "parallel.moe.shared_expert_overlap")
def _recompute_shared_experts_no_overlap(f: PlanFacts):
    return f.shared_recompute & f.shared_overlap


@stack_rule("no_te_cross_entropy", "Transformer Engine's fused cross-entropy",
            "system.software.kernels.fused_cross_entropy",
            "system.software.kernels.cross_entropy_fusion_impl")
def _no_te_cross_entropy(f: PlanFacts):
    return f.te_cross_entropy


@stack_rule("no_fp8_param_gather", "FP8 parameters (Megatron's --fp8-param-gather)",
            "system.software.kernels.fp8_param_gather", "train.dtype")
def _no_fp8_param_gather(f: PlanFacts):
    return f.fp8_params


@stack_rule("no_mla", "multi-latent attention (DeepSeek's MLA: kv_lora_rank)",
            "model.kv_lora_rank")
def _no_mla(f: PlanFacts):
    return f.mla


@stack_rule("no_squared_relu", "a squared-ReLU MLP (Nemotron's relu2)", "model.hidden_act")
def _no_squared_relu(f: PlanFacts):
    return f.squared_relu


@stack_rule("squared_relu_no_bias_fusion", "squared ReLU on an MLP with biases with the "
            "bias-activation fusion on (Megatron fuses a bias only into GeLU and SwiGLU: set "
            "system.software.kernels.fused_bias_gelu: false, Megatron-LM's "
            "--no-bias-gelu-fusion)", "model.hidden_act", "model.mlp_bias",
            "system.software.kernels.fused_bias_gelu")
def _squared_relu_no_bias_fusion(f: PlanFacts):
    return f.squared_relu & f.bias_act_fusion
