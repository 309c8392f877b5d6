"""Decoder-only transformers: the ``gpt`` and ``llama`` workload families.

Both share one trace builder (:mod:`.builder`, :mod:`.build`) and one memory model
(:mod:`.memory`) over :class:`~ddlsim.workloads.models.decoder.DecoderShape`; they differ in
their model section (:mod:`.schema`) and presets. HuggingFace ``config.json`` files of
``model_type`` ``gpt2`` (→ ``gpt``) and ``llama``, ``mistral``, ``qwen2`` and the Mixture-of-Experts ``mixtral`` and ``qwen2_moe`` (→ ``llama``
with MoE fields) are read by :func:`ddlsim.workloads.models.hf.from_hf_config`. How a layer is
split over the tensor-parallel grid (1-D, 2-D, 2.5-D, 3-D) and the ``cp`` axis is a layer
partitioner (:mod:`.partition`, docs/tensor_parallel.md).
"""

from __future__ import annotations

from typing import Any

from ..registry import WorkloadFamily, read_presets, register_workload
from .fsdp import check_fsdp
from .moeplan_checks import check_moe_plan
from .overlap import check_overlap
from .param_gather import check_fp8
from .partition import partitioners
from .proxy import check_proxy_plan
from .schema import GPTModel, LlamaModel, NemotronModel
from .split import chunk_layers

__all__ = ["DecoderFamily", "GPTFamily", "LlamaFamily", "NemotronFamily", "GPTModel",
           "LlamaModel", "NemotronModel"]


class DecoderFamily(WorkloadFamily):
    """What the decoder families share: plan rules, builder, memory, summary, HF reading."""

    kind = "decoder"

    def check(self, cfg: Any) -> None:
        """Megatron-LM's divisibility rules and the sequence against the positions."""
        m, p, t = cfg.model, cfg.parallel, cfg.train
        tp = p.tp
        _check_partition(cfg)
        if p.tp_mode != "1d":
            tp = 1   # the scheme's own grid rules replace Megatron's (checked above)
        if m.num_attention_heads % tp:
            raise ValueError(f"model.num_attention_heads = {m.num_attention_heads} is not divisible "
                             f"by parallel.tensor_model_parallel_size = {tp}")
        g = getattr(m, "num_key_value_heads", None)
        if g is not None and g % tp:
            raise ValueError(f"model.num_key_value_heads = {g} is not divisible by "
                             f"parallel.tensor_model_parallel_size = {tp}: each tensor-parallel "
                             "rank holds whole key/value heads (Megatron-LM: num_query_groups "
                             "% tensor_model_parallel_size == 0); use a TP size that divides it")
        if m.ffn_size % tp:
            raise ValueError(f"model.intermediate_size = {m.ffn_size} is not divisible by "
                             f"parallel.tensor_model_parallel_size = {tp}")
        chunk_layers(cfg)   # Megatron-Core's (un)even pipeline split, each rule checked
        if m.max_position_embeddings is not None and t.seq_length > m.max_position_embeddings:
            raise ValueError(f"train.seq_length = {t.seq_length} exceeds "
                             f"model.max_position_embeddings = {m.max_position_embeddings}")
        if p.sequence_parallel and t.seq_length % tp:
            raise ValueError(f"sequence_parallel needs train.seq_length = {t.seq_length} divisible "
                             f"by tensor_model_parallel_size = {tp}")
        _check_experts(cfg)
        check_fsdp(cfg)
        check_overlap(cfg)
        check_fp8(cfg)
        check_proxy_plan(cfg)
        _check_collective_buffers(cfg, "decoder")

    def build(self, cfg: Any):
        from .build import build_decoder_workload
        if cfg.model.program != "megatron":  # a GPT proxy's program (.proxy)
            from .proxy import build_proxy_workload
            return build_proxy_workload(cfg, cfg.model.shape())
        return build_decoder_workload(cfg, cfg.model.shape())

    def memory(self, cfg: Any) -> list:
        from .build import decoder_memory
        if cfg.model.program != "megatron":
            from .proxy import proxy_memory
            return proxy_memory(cfg, cfg.model.shape())
        return decoder_memory(cfg, cfg.model.shape())

    def bundled_hf_presets(self) -> dict[str, dict]:
        """The presets of ``data/decoders.yaml`` whose bundled ``config.json`` has one of this
        family's HuggingFace model types, as sections of this family's architecture."""
        import json
        from importlib import resources

        data = resources.files("ddlsim.data")
        out = {}
        for name, p in read_presets("decoders.yaml").items():
            doc = json.loads(data.joinpath(p["hf_config"]).read_text())
            if doc.get("model_type") in self.hf_model_types:
                out[name] = {"architecture": self.architecture,
                             "hf_config": p["hf_config"].removeprefix("hf/").removesuffix(".json"),
                             "source": p["source"]}
        return out

    def summary(self, model: Any) -> str:
        """``name: L layers, h hidden, heads (KV heads), MLP, norm, positions, embeddings,
        parameters`` in one line."""
        sh = model.shape()
        attn = f"{sh.heads} heads" + ("" if sh.g == sh.heads else f" ({sh.g} KV)")
        act = {"silu": "SwiGLU", "swish": "SwiGLU"}.get(sh.activation, "GeGLU")
        mlp = f"{act if sh.gated_mlp else 'squared-ReLU' if sh.squared_relu else 'GeLU'} {sh.ffn}"
        norm = "RMSNorm" if sh.norm == "rmsnorm" else "LayerNorm"
        if sh.is_moe:
            every = "" if sh.moe_layer_freq == 1 else f" every {sh.moe_layer_freq} layers"
            mlp = (f"MoE {sh.experts}×{mlp.split()[0]} {sh.f_e} top-{sh.top_k}{every}"
                   + (f" +{sh.shared_experts} shared" if sh.shared_experts else ""))
        from .variants import variant_phrases
        extra_attn, extra_mlp = variant_phrases(sh)   # MLA, qk-norm, sinks, window, dense
        attn, mlp = attn + extra_attn, mlp + extra_mlp

        def count(n: int) -> str:
            return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"
        active = f" ({count(sh.active_params)} active)" if sh.is_moe else ""
        return (f"{model.name}: {sh.layers} layers, h {sh.hidden}, {attn}, {mlp}, {norm}, "
                f"{sh.positions}{_rotary_share(sh)}, "
                f"{'tied' if sh.tied_embeddings else 'untied'}, vocab "
                f"{sh.vocab}, {count(sh.params)} params{active}")

    def plan_summary(self, cfg: Any) -> str:
        """Megatron-LM's plan line, with the tensor-parallel scheme and grid when it is not
        1-D (``TP64 2.5-D [4,4,4]``), an uneven split's layers per stage (each virtual
        stage's when ``layers_per_virtual_stage`` gives them, or the stack's own split: its
        rule named), the context-parallel axis when
        there is one (``CP4 ring``, ``CP4 all-gather``), expert parallelism, carved out
        of data parallelism as in Megatron-Core (``DP16 (EP8)``), and the interleaved
        schedule's micro-batch groups where they are not PP (``PP4(v2, micro-batches in groups
        of 6)``)."""
        p = cfg.parallel
        axes = f"TP{p.tp}"
        if p.tp_mode != "1d":
            axes += f" {_grid_label(p.tensor_parallel)}"
        if p.sequence_parallel:
            axes += f" SP{_sp_required(cfg)}"
        if p.cp > 1:
            axes += f" × CP{p.cp} {_cp_label(cfg)}"
        line = super().plan_summary(cfg).removeprefix(f"TP{p.tp}")
        from .split import chunk_layers, is_uneven, stack_split_applies, virtual_stage_layers
        own = stack_split_applies(cfg)
        if is_uneven(p) or own:   # an uneven split: the layers of each stage
            per_stage = [sum(row) for row in chunk_layers(cfg)]
            split = f"{_stage_layers(per_stage)} layers"
            if p.layers_per_virtual_stage is not None or own:    # each virtual stage's
                rule = f" ({cfg.software.pipeline_split}'s split)" if own else ""
                each = "virtual stage" if p.vpp > 1 else "stage"   # no chunks: a stage's
                split = f"{_stage_layers(virtual_stage_layers(cfg))} layers per {each}{rule}"
            pp_label = f"PP{p.pp}{f'(v{p.vpp})' if p.vpp > 1 else ''}"
            line = line.replace(pp_label, f"{pp_label} [{split}]", 1)
        if p.ep > 1:
            line = line.replace(f"× DP{cfg.dp} =", f"× DP{cfg.dp} (EP{p.ep}) =", 1)
        group = cfg.other_microbatch_group
        if group is not None:   # not Megatron's PP
            line = line.replace(f"(v{p.vpp})", f"(v{p.vpp}, micro-batches in groups of {group})",
                                1)
        from .overlap import overlap_phrase
        from .moeplan import resolve_moe
        moe = resolve_moe(cfg)
        return (axes + line + _grad_phrase(cfg) + f", {overlap_phrase(cfg)}"
                + ("" if moe is None else f"; {moe.phrase()}"))

    def moe_plan(self, cfg: Any) -> Any | None:
        """The plan's MoE options (:func:`.moeplan.resolve_moe`); None for a dense model."""
        from .moeplan import resolve_moe
        return resolve_moe(cfg)

    def group_labels(self, cfg: Any) -> dict[str, str]:
        """``tp`` with the grid's group families when the scheme is not 1-D (their bytes
        are counted as ``tp``), ``cp`` with its comm type."""
        p, out = cfg.parallel, {}
        if p.tp_mode != "1d":
            from .plan import resolve_plan
            names = resolve_plan(cfg, cfg.model.shape()).partitioner.families(cfg.mesh)
            out["tp"] = f"tp ({_grid_label(p.tensor_parallel)}: {', '.join(names)})"
        if p.cp > 1:
            out["cp"] = f"cp ({_cp_label(cfg)})"
        return out

    def from_hf(self, doc: dict, source: str) -> tuple[dict, list[str]]:
        from ..models.hf import from_hf_config
        from ..models.hf_router import router_aux_loss_coef, router_balancing, router_groups

        fields, unmodelled = from_hf_config(doc, source=source)
        section = _section(fields)
        coef = router_aux_loss_coef(doc, source)   # parallel.moe.aux_loss_coeff's default
        if coef is not None and fields.get("experts"):
            section["router_aux_loss_coef"] = coef
        groups = router_groups(doc, source)   # parallel.moe.router_num_groups' default
        if groups is not None:
            section["n_group"], section["topk_group"] = groups
        if fields.get("experts"):   # DeepSeek's: parallel.moe's balancing defaults
            section.update(router_balancing(doc, source))
        return section, unmodelled


def _rotary_share(sh: Any) -> str:
    """`` (50 % of each head)`` for partial rotary embeddings, else nothing."""
    return "" if sh.rotary_share == 1 else f" ({sh.rotary_share:.0%} of each head)"


def _stage_layers(per_stage: list[int]) -> str:
    """``15+16×6+15`` for an uneven split's layers per pipeline stage (runs of equal counts
    folded)."""
    runs: list[list[int]] = []
    for n in per_stage:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "+".join(f"{n}×{k}" if k > 1 else f"{n}" for n, k in runs)


def _section(f: dict) -> dict:
    """A model section from :class:`DecoderShape` fields (HuggingFace names)."""
    common = {"num_hidden_layers": f["layers"], "hidden_size": f["hidden"],
              "num_attention_heads": f["heads"], "vocab_size": f["vocab"],
              "max_position_embeddings": f.get("max_positions"),
              "tie_word_embeddings": f["tied_embeddings"]}
    if f.get("activation") == "relu2":
        return {"architecture": "nemotron", **common, "num_key_value_heads": f.get("kv_heads"),
                "head_dim": f.get("head_dim"), "intermediate_size": f["ffn"],
                "partial_rotary_factor": f.get("rotary_share", 1.0),
                "attention_bias": f["out_bias"], "mlp_bias": f["mlp_bias"]}
    if not f.get("gated_mlp"):
        ffn = f["ffn"]
        return {"architecture": "gpt", **common,
                "intermediate_size": None if ffn == 4 * f["hidden"] else ffn}
    out = {"architecture": "llama", **common, "num_key_value_heads": f.get("kv_heads"),
           "head_dim": f.get("head_dim"), "intermediate_size": f["ffn"],
           "hidden_act": f["activation"], "attention_bias": f["out_bias"],
           "mlp_bias": f["mlp_bias"]}
    if f["qkv_bias"] != f["out_bias"]:
        out["qkv_bias"] = f["qkv_bias"]
    if f.get("experts"):
        moe = {"num_local_experts": f["experts"], "num_experts_per_tok": f["top_k"],
               "moe_intermediate_size": f.get("expert_ffn"),
               "decoder_sparse_step": f.get("moe_layer_freq", 1),
               "n_shared_experts": f.get("shared_experts", 0),
               "shared_expert_intermediate_size": f.get("shared_expert_ffn"),
               "shared_expert_gate": f.get("shared_expert_gate", False)}
        out.update({k: v for k, v in moe.items() if v is not None})
    from .variants import variant_section
    out.update(variant_section(f))   # MLA, query/key norms, sinks, window, dense prefix
    return out


def _cp_label(cfg: Any) -> str:
    """``ring`` or ``all-gather``: how context-parallel attention exchanges K/V, the plan's
    ``cp_comm_type`` or, unset, the stack's."""
    return "ring" if cfg.software.cp_comm_type == "p2p" else "all-gather"


def _sp_required(cfg: Any) -> str:
    """`` (R)``, the stack's rule, when ``cfg``'s stack refuses its TP without sequence
    parallelism (:func:`~ddlsim.stackrules.sp_rules`), else ``""``."""
    from ...stackrules import sp_rules
    names = sp_rules(cfg)
    return f" ({names[0]})" if names else ""


def _grid_label(spec: Any) -> str:
    """``2-D [q,q]``, ``2.5-D [q,q,d]``, ``3-D [q,q,q]`` (docs/tensor_parallel.md); another
    registered scheme as its mode and grid fields."""
    q, d = spec.q, spec.d
    dims = {"2d": (q, q), "2.5d": (q, q, d), "3d": (q, q, q)}.get(spec.mode)
    if dims is None:
        fields = ", ".join(f"{k} {getattr(spec, k)}" for k in ("size", "q", "d")
                           if getattr(spec, k) is not None)
        return f"{spec.mode} ({fields})"
    return f"{spec.mode.removesuffix('d')}-D [{','.join(map(str, dims))}]"


def _check_partition(cfg: Any) -> None:
    """What the tensor-parallel schemes and context parallelism model (docs/tensor_parallel.md):
    dense layers, DDP with ZeRO 0-2, and the grid's and the ring's divisibility."""

    m, p, t = cfg.model, cfg.parallel, cfg.train
    mode, cp = p.tp_mode, p.cp
    if mode == "1d" and cp == 1:
        return
    plan = (f"tensor_parallel.mode = {mode!r}" if mode != "1d" else "") + \
        (" with " if mode != "1d" and cp > 1 else "") + \
        (f"context_parallel_size = {cp}" if cp > 1 else "")
    if m.num_local_experts and mode != "1d":
        raise ValueError(f"{plan} is modelled for dense models; model {m.name!r} has "
                         f"{m.num_local_experts} experts (Mixture-of-Experts layers keep the "
                         "1-D scheme, with or without context parallelism); use a dense model "
                         "or the 1-D plan")
    fsdp = mode == "1d" and cfg.software.zero3_gather == "per_layer"   # FSDP units with CP
    if (p.zero_stage == 3 and not fsdp) or p.dp_strategy != "ddp":
        raise ValueError(f"{plan} is modelled with dp_strategy = 'ddp' and zero_stage 0 to 2, "
                         "or ZeRO-3 as per-layer FSDP units (zero3_gather: per_layer) with 1-D "
                         f"tensor parallelism; got dp_strategy = {p.dp_strategy!r}, zero_stage "
                         f"= {p.zero_stage}, zero3_gather = {cfg.software.zero3_gather!r}; "
                         "change one of them")
    if cp > 1 and t.seq_length % (2 * cp):
        raise ValueError(f"train.seq_length = {t.seq_length} is not divisible by 2 × "
                         f"context_parallel_size = {2 * cp}: the causal load balance cuts each "
                         f"sequence into 2·cp chunks (Megatron-Core) and rank r holds chunks r "
                         f"and 2·cp−1−r; use a multiple of {2 * cp}")
    if mode != "1d":
        partitioners()[mode].check(p.tensor_parallel, m.shape(), t.micro_batch_size)


def _check_experts(cfg: Any) -> None:
    """Expert parallelism: EP divides the experts (EP × expert TP is carved out of TP·CP·DP,
    Megatron-Core's MoE parallel folding: checked by the mesh; what a stack's code further
    refuses, such as EP dividing DP in 2024, is a rule of the stack), the MoE options
    (:func:`.moeplan_checks.check_moe_plan`), and each model chunk holds whole periods of
    ``decoder_sparse_step`` layers."""
    m, p = cfg.model, cfg.parallel
    E, ep = m.num_local_experts, p.ep
    if not E:
        if ep > 1:
            raise ValueError(f"parallel.expert_model_parallel_size = {ep} needs a "
                             f"Mixture-of-Experts model, but model {m.name!r} has no experts "
                             "(num_local_experts = 0); use 1")
        check_moe_plan(cfg)
        return
    if E % ep:
        raise ValueError(f"parallel.expert_model_parallel_size = {ep} does not divide "
                         f"model.num_local_experts = {E}: each expert-parallel rank holds "
                         f"E/EP whole experts; use a divisor of {E}")
    check_moe_plan(cfg)
    odd = sorted({n for row in chunk_layers(cfg) for n in row if n % m.decoder_sparse_step})
    if odd:
        raise ValueError(f"model.decoder_sparse_step = {m.decoder_sparse_step} does not divide "
                         f"the {odd[0]} layers of a model chunk (num_hidden_layers / (PP·VPP), "
                         "or the uneven split's): every chunk must hold whole dense…MoE "
                         "periods; choose PP so that it does")
    if p.dp_strategy != "ddp":
        raise ValueError(f"dp_strategy = {p.dp_strategy!r} with a Mixture-of-Experts model: "
                         "expert gradients are reduced over the expert-data-parallel group, "
                         "which only dp_strategy = 'ddp' (with ZeRO 0-3) models; use 'ddp'")


@register_workload("gpt")
class GPTFamily(DecoderFamily):
    """GPT-2, GPT-3 and Megatron-LM's GPTs (presets in ``data/models.yaml``)."""

    schema = GPTModel
    presets_file = "models.yaml"
    hf_model_types = ("gpt2",)


@register_workload("llama")
class LlamaFamily(DecoderFamily):
    """Llama 2/3, Mistral, Qwen2 (presets: the bundled ``config.json`` files of
    ``data/decoders.yaml``, Mixtral included)."""

    schema = LlamaModel
    hf_model_types = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3", "qwen3_moe",
                      "deepseek_v3", "deepseek_v2", "phi3", "gpt_oss")

    def presets(self) -> dict[str, dict]:
        return self.bundled_hf_presets()


@register_workload("nemotron")
class NemotronFamily(DecoderFamily):
    """NVIDIA's Nemotron-4 (squared-ReLU MLP, LayerNorm1p, partial rotary embeddings; presets:
    the bundled ``config.json`` files of ``data/decoders.yaml`` whose model_type is
    ``nemotron``)."""

    schema = NemotronModel
    hf_model_types = ("nemotron",)

    def presets(self) -> dict[str, dict]:
        return self.bundled_hf_presets()


def _grad_phrase(cfg: Any) -> str:
    """``, fp32 grads`` when the gradients are kept and reduced in another dtype than the
    parameters (the stack's ``grad_reduce_dtype``, docs/compute.md), else nothing."""
    from ...config_types import DTYPE_BYTES
    from .layerkernels import compute_dtype, grad_bytes
    return ", fp32 grads" if grad_bytes(cfg) != DTYPE_BYTES[compute_dtype(cfg.train.dtype)] else ""


def _check_collective_buffers(cfg: Any, family: str) -> None:
    """Refuse ``parallel.collective_buffers: separate``: the family builds no collective over a
    group of one rank (it leaves them out), so the one-rank copy
    (:mod:`ddlsim.workloads.onerankcopy`) would have nothing to follow and the option would be
    ignored."""
    if cfg.parallel.collective_buffers != "in_place":
        raise ValueError(f"parallel.collective_buffers = {cfg.parallel.collective_buffers!r}: the "
                         f"{family} family leaves collectives over one-rank groups out of its "
                         "trace, so their copy cannot be charged; allowed here: 'in_place' (the "
                         "resnet, cosmoflow and dlrm families read 'separate')")
