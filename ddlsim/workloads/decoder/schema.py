"""Model sections of the decoder family, with HuggingFace ``config.json`` field names.

Two arms of the union discriminated on ``architecture``:

* ``gpt``: GPT-2/GPT-3/Megatron GPT: LayerNorm, learned positions, GeLU MLP, biases,
  multi-head attention; tied embeddings unless ``tie_word_embeddings: false``.
* ``llama``: Llama/Mistral/Qwen2: RMSNorm, rotary positions, gated MLP (SwiGLU with
  ``hidden_act: silu``, GeGLU with ``gelu``), grouped-query attention
  (``num_key_value_heads``), untied embeddings unless ``tie_word_embeddings: true``, no
  biases unless ``attention_bias`` (q, k, v, o), ``qkv_bias`` (q, k, v only: Qwen2) or
  ``mlp_bias``.

* ``nemotron``: NVIDIA's Nemotron-4 and Minitron (HuggingFace ``NemotronForCausalLM``):
  LayerNorm (``layernorm1p``: the same kernels, a zero-centred weight), rotary positions on
  ``partial_rotary_factor`` of each head, an ungated squared-ReLU MLP (``hidden_act:
  relu2``), grouped-query attention, no biases unless ``attention_bias`` or ``mlp_bias``,
  untied embeddings, no dropout; dense only.

``gpt`` and ``llama`` take Mixture-of-Experts fields (:class:`MoEFields`, HuggingFace names where
they exist): ``num_local_experts`` (Mixtral), ``num_experts_per_tok``, ``moe_intermediate_size``
(Qwen2-MoE), ``capacity_factor`` (GShard/Switch; null: dropless), ``decoder_sparse_step``
(Qwen2-MoE: every n-th layer is an MoE layer), ``n_shared_experts`` (DeepSeek) of
``shared_expert_intermediate_size`` (Qwen2-MoE) with an optional ``shared_expert_gate``,
``first_k_dense_replace`` (DeepSeek-V3: the first layers keep a dense MLP) and ``router_bias``
(GPT-OSS), ``router_aux_loss_coef`` (the load-balancing loss coefficient the model's
``config.json`` gives: ``parallel.moe.aux_loss_coeff`` left unset takes it), ``n_group``
and ``topk_group`` (DeepSeek's group-limited routing: ``parallel.moe.router_num_groups`` and
``router_group_topk`` left unset take them), and DeepSeek's ``seq_aux``, ``scoring_func`` and
``topk_method`` (the balancing type, the score function and, with ``noaux_tc``, expert-bias
balancing: ``parallel.moe.router_load_balancing_type``, ``router_score_function`` and
``router_enable_expert_bias`` left unset take them; :func:`ddlsim.workloads.models.hf.
router_balancing`).

The ``llama`` arm also takes the attention variants of today's models: Multi-head Latent
Attention (DeepSeek-V3: ``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``; :mod:`ddlsim.workloads.models.mla`), query/key norms
(Qwen3: ``qk_norm``), attention sinks (GPT-OSS: ``attention_sinks``) and sliding-window
attention (``sliding_window`` keys on ``window_layers`` of the layers, default all;
:mod:`ddlsim.simulator.kernels.window`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StrictBool, model_validator

from ...config import ModelBase, count_type, reject_bool
from ..models.decoder import DecoderShape
from .programs import ProgramFields
from .variants import variant_shape_fields

__all__ = ["GPTModel", "LlamaModel", "NemotronModel", "MoEFields", "GATED_ACTIVATIONS"]

#: Non-linearities of a gated MLP (HuggingFace ACT2FN names): SiLU → SwiGLU, GeLU → GeGLU.
GATED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh",
                     "relu")

_Experts = Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=2**20)]
_Groups = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=2**20)]


class MoEFields(ModelBase):
    """Mixture-of-Experts fields; ``num_local_experts = 0`` (the default) is a dense model."""

    num_local_experts: _Experts = Field(default=0, description="routed experts per MoE layer")
    num_experts_per_tok: count_type("heads") | None = Field(
        default=None, description="top-k: experts per token (required with experts)")
    moe_intermediate_size: count_type("intermediate_size") | None = Field(
        default=None, description="expert FFN size; default intermediate_size")
    capacity_factor: Annotated[float, BeforeValidator(reject_bool), Field(gt=0, le=1e3)] | None \
        = Field(default=None, description="expert capacity factor; null: dropless")
    decoder_sparse_step: count_type("layers") = Field(
        default=1, description="every n-th layer is an MoE layer (1: every layer)")
    n_shared_experts: _Experts = Field(default=0, description="always-active shared experts")
    shared_expert_intermediate_size: count_type("intermediate_size") | None = Field(
        default=None, description="shared expert FFN size; default moe_intermediate_size")
    shared_expert_gate: StrictBool = False
    first_k_dense_replace: Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=2**20)] \
        = Field(default=0, description="the first layers keep a dense MLP (DeepSeek-V3)")
    router_bias: StrictBool = Field(default=False, description="a bias of E on the router")
    router_aux_loss_coef: Annotated[float, BeforeValidator(reject_bool),
                                    Field(ge=0.0, le=1e3)] | None = Field(
        default=None, description="the load-balancing loss coefficient of the model's "
                                  "config.json (HuggingFace's name); parallel.moe."
                                  "aux_loss_coeff unset takes it under aux_loss or "
                                  "seq_aux_loss balancing")
    n_group: _Groups | None = Field(
        default=None, description="expert groups of group-limited routing (DeepSeek's "
                                  "config.json); parallel.moe.router_num_groups unset takes it")
    topk_group: _Groups | None = Field(
        default=None, description="the groups each token's experts come from (DeepSeek's "
                                  "config.json); parallel.moe.router_group_topk unset takes it")

    seq_aux: StrictBool | None = Field(
        default=None, description="the balance loss per sequence (DeepSeek's config.json, "
                                  "beside router_aux_loss_coef); parallel.moe."
                                  "router_load_balancing_type unset takes seq_aux_loss")
    scoring_func: Literal["softmax", "sigmoid", "sqrtsoftplus"] | None = Field(
        default=None, description="the router's score function (DeepSeek's config.json); "
                                  "parallel.moe.router_score_function unset takes it")
    topk_method: Literal["greedy", "group_limited_greedy", "noaux_tc"] | None = Field(
        default=None, description="DeepSeek's router selection rule (its config.json); "
                                  "noaux_tc is expert-bias (auxiliary-loss-free) balancing: "
                                  "parallel.moe.router_enable_expert_bias unset takes it on")

    @model_validator(mode="after")
    def _check_moe(self) -> "MoEFields":
        E, k = self.num_local_experts, self.num_experts_per_tok
        moe_only = {n: getattr(self, n) for n in (
            "num_experts_per_tok", "moe_intermediate_size", "capacity_factor",
            "shared_expert_intermediate_size", "router_aux_loss_coef", "n_group", "topk_group",
            "seq_aux", "scoring_func", "topk_method")
            if getattr(self, n) is not None}
        moe_only.update({n: getattr(self, n) for n in ("n_shared_experts", "shared_expert_gate")
                         if getattr(self, n)})
        if self.decoder_sparse_step != 1:
            moe_only["decoder_sparse_step"] = self.decoder_sparse_step
        moe_only.update({n: getattr(self, n) for n in ("first_k_dense_replace", "router_bias")
                         if getattr(self, n)})
        if E == 0:
            if moe_only:
                raise ValueError(f"model fields {moe_only} describe Mixture-of-Experts layers "
                                 "but num_local_experts is 0 (a dense model); set "
                                 "num_local_experts or remove them")
            return self
        if k is None or k > E:
            raise ValueError(f"model.num_experts_per_tok = {k} with num_local_experts = {E}: "
                             f"an MoE model needs top-k between 1 and {E}")
        if self.decoder_sparse_step > self.num_hidden_layers:
            raise ValueError(f"model.decoder_sparse_step = {self.decoder_sparse_step} exceeds "
                             f"num_hidden_layers = {self.num_hidden_layers}: no layer would be an "
                             "MoE layer")
        if self.shared_expert_gate and not self.n_shared_experts:
            raise ValueError("model.shared_expert_gate = true needs n_shared_experts >= 1")
        if self.first_k_dense_replace >= self.num_hidden_layers:
            raise ValueError(f"model.first_k_dense_replace = {self.first_k_dense_replace} leaves "
                             f"no MoE layer of num_hidden_layers = {self.num_hidden_layers}; use "
                             f"0 to {self.num_hidden_layers - 1}, or a dense model")
        return self

    def moe_shape_fields(self) -> dict:
        """The :class:`DecoderShape` MoE keyword arguments of these fields."""
        if not self.num_local_experts:
            return {}
        return dict(experts=self.num_local_experts, top_k=self.num_experts_per_tok,
                    expert_ffn=self.moe_intermediate_size,
                    moe_layer_freq=self.decoder_sparse_step,
                    shared_experts=self.n_shared_experts,
                    shared_expert_ffn=self.shared_expert_intermediate_size,
                    shared_expert_gate=self.shared_expert_gate,
                    capacity_factor=self.capacity_factor,
                    first_dense_layers=self.first_k_dense_replace, router_bias=self.router_bias)


class DecoderFields(MoEFields, ProgramFields):
    """The fields every decoder family shares (HuggingFace names), and the program options
    (:mod:`.programs`: Megatron-LM's or a GPT proxy's)."""

    num_hidden_layers: count_type("layers")
    hidden_size: count_type("hidden_size")
    num_attention_heads: count_type("heads")
    vocab_size: count_type("vocab_size")
    mtp_num_layers: Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=2**20)] = Field(
        default=0, description="Megatron-Core's multi-token-prediction depth (--mtp-num-layers; "
                               "DeepSeek-V3's config.json num_nextn_predict_layers): per depth "
                               "an embedding lookup, two norms, a 2h→h projection, one more "
                               "layer, the head and its loss on the last stage (workloads/"
                               "decoder/mtp.py); a pipeline layout's 'm' must count them")


class GPTModel(DecoderFields):
    """A GPT: LayerNorm, learned positions, GeLU MLP, biases, multi-head attention."""

    architecture: Literal["gpt"] = "gpt"
    intermediate_size: count_type("intermediate_size") | None = Field(
        default=None, description="default 4·hidden_size")
    max_position_embeddings: count_type("seq_length")
    tie_word_embeddings: StrictBool = True
    dropout: StrictBool = Field(
        default=True, description="dropout on the attention probabilities and after the "
                                  "attention and the MLP (GPT-2's attn_pdrop and resid_pdrop, "
                                  "Megatron-LM's --attention-dropout and --hidden-dropout, "
                                  "0.1 by default); false: trained without (no dropout "
                                  "kernels or masks)")

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def shape(self) -> DecoderShape:
        """The closed-form counts of this model."""
        return DecoderShape(self.num_hidden_layers, self.hidden_size, self.num_attention_heads,
                            self.ffn_size, self.vocab_size, self.max_position_embeddings,
                            tied_embeddings=self.tie_word_embeddings, dropout=self.dropout,
                            **self.moe_shape_fields())


def check_heads(m: DecoderFields, head_size_given: bool = False) -> None:
    """The grouped-query attention rules of a ``llama`` or ``nemotron`` section (raises
    ValueError, the section validator's): whole query-head groups per key/value head, and a
    hidden size that divides into the heads unless ``head_dim`` (or ``head_size_given``, MLA's
    own head sizes) gives the head size."""
    a, g = m.num_attention_heads, m.num_key_value_heads or m.num_attention_heads
    if a % g:
        raise ValueError(f"num_attention_heads = {a} is not a multiple of "
                         f"num_key_value_heads = {g}: each key/value head serves a whole "
                         "group of query heads")
    if m.head_dim is None and m.hidden_size % a and not head_size_given:
        raise ValueError(f"hidden_size = {m.hidden_size} is not a multiple of "
                         f"num_attention_heads = {a}; give head_dim")


class LlamaModel(DecoderFields):
    """A Llama-style decoder (Llama 2/3, Mistral, Qwen2)."""

    architecture: Literal["llama"] = "llama"
    num_key_value_heads: count_type("heads") | None = Field(
        default=None, description="default num_attention_heads (multi-head attention)")
    head_dim: count_type("hidden_size") | None = Field(
        default=None, description="default hidden_size / num_attention_heads")
    intermediate_size: count_type("intermediate_size")
    max_position_embeddings: count_type("seq_length") | None = None
    tie_word_embeddings: StrictBool = False
    hidden_act: Literal[GATED_ACTIVATIONS] = "silu"
    attention_bias: StrictBool = False
    qkv_bias: StrictBool | None = Field(
        default=None, description="biases on q, k, v only (Qwen2); default attention_bias")
    mlp_bias: StrictBool = False
    q_lora_rank: count_type("hidden_size") | None = Field(
        default=None, description="MLA query latent width; null: direct query projection")
    kv_lora_rank: count_type("hidden_size") | None = Field(
        default=None, description="MLA key/value latent width (sets Multi-head Latent Attention)")
    qk_nope_head_dim: count_type("hidden_size") | None = None
    qk_rope_head_dim: count_type("hidden_size") | None = None
    v_head_dim: count_type("hidden_size") | None = None
    qk_norm: StrictBool = Field(default=False, description="RMSNorm of query and key heads")
    attention_sinks: StrictBool = Field(default=False, description="one sink logit per head")
    swiglu_limit: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="the gated MLP's inputs clamped: the gate at most this, the "
        "linear half within +-this (GPT-OSS)")
    sliding_window: count_type("seq_length") | None = Field(
        default=None, description="keys a query sees in a sliding-window layer")
    window_layers: count_type("layers") | None = Field(
        default=None, description="layers with the window; default all with sliding_window")

    @model_validator(mode="after")
    def _check(self) -> "LlamaModel":
        check_heads(self, head_size_given=self.kv_lora_rank is not None)   # MLA: its own
        from .variants import check_variants
        check_variants(self)
        return self

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size

    def shape(self) -> DecoderShape:
        """The closed-form counts of this model."""
        qkv = self.attention_bias if self.qkv_bias is None else self.qkv_bias
        return DecoderShape(
            self.num_hidden_layers, self.hidden_size, self.num_attention_heads,
            self.intermediate_size, self.vocab_size, self.max_position_embeddings,
            kv_heads=self.num_key_value_heads, head_dim=self.head_dim, gated_mlp=True,
            activation=self.hidden_act, norm="rmsnorm", positions="rotary",
            tied_embeddings=self.tie_word_embeddings, qkv_bias=qkv,
            out_bias=self.attention_bias, mlp_bias=self.mlp_bias, dropout=False,
            **self.moe_shape_fields(), **variant_shape_fields(self))


class NemotronModel(DecoderFields):
    """A Nemotron-4 decoder (HuggingFace ``model_type: nemotron``, transformers'
    ``modeling_nemotron.py``: ``NemotronLayerNorm1P``, ``NemotronMLP`` as ``down_proj(
    act_fn(up_proj(x)))`` with ``ACT2FN["relu2"]``, partial rotary embeddings)."""

    architecture: Literal["nemotron"] = "nemotron"
    num_key_value_heads: count_type("heads") | None = Field(
        default=None, description="default num_attention_heads (multi-head attention)")
    head_dim: count_type("hidden_size") | None = Field(
        default=None, description="default hidden_size / num_attention_heads")
    intermediate_size: count_type("intermediate_size")
    max_position_embeddings: count_type("seq_length") | None = None
    tie_word_embeddings: StrictBool = False
    hidden_act: Literal["relu2"] = Field(
        default="relu2", description="squared ReLU, the only activation Nemotron-4 uses")
    partial_rotary_factor: Annotated[float, BeforeValidator(reject_bool), Field(gt=0, le=1)] = \
        Field(default=0.5, description="share of each head's dimensions the rotary embedding "
                                       "rotates (transformers' NemotronConfig default 0.5; "
                                       "NeMo's rotary_percentage)")
    attention_bias: StrictBool = False
    mlp_bias: StrictBool = False

    @model_validator(mode="after")
    def _check(self) -> "NemotronModel":
        check_heads(self)
        if self.num_local_experts:
            raise ValueError(f"model.num_local_experts = {self.num_local_experts} with "
                             "architecture nemotron: its squared-ReLU experts are not "
                             "modelled (the dense Nemotron-4 is); use 0")
        return self

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size

    def shape(self) -> DecoderShape:
        """The closed-form counts of this model."""
        return DecoderShape(
            self.num_hidden_layers, self.hidden_size, self.num_attention_heads,
            self.intermediate_size, self.vocab_size, self.max_position_embeddings,
            kv_heads=self.num_key_value_heads, head_dim=self.head_dim, gated_mlp=False,
            activation=self.hidden_act, norm="layernorm", positions="rotary",
            rotary_share=self.partial_rotary_factor,
            tied_embeddings=self.tie_word_embeddings, qkv_bias=self.attention_bias,
            out_bias=self.attention_bias, mlp_bias=self.mlp_bias, dropout=False)
