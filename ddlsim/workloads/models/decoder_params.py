"""The parameter counts of :class:`~.decoder.DecoderShape`: one (expert) MLP, the attention
projections, norms, router and shared experts, a dense and an MoE layer, the stack, the
embeddings and the whole model, and a dense layer's tensors by module on one TP rank.

The formulas, per layer and for the embeddings, are in :mod:`.decoder`'s docstring ("Parameters
of one layer"; Touvron et al. 2023 checks them: Llama 2 7B = 6,738,415,616, 70B =
68,976,648,192).
"""

from __future__ import annotations

__all__ = ["DecoderParams"]


class DecoderParams:
    """Parameter counts (elements, not bytes; a mixin of ``DecoderShape``, whose sizes these
    methods read)."""

    __slots__ = ()

    def mlp_params(self, f: int) -> int:
        """One (expert) MLP of size ``f``: ``m·h·f`` plus biases."""
        bias = (self.mlp_matrices - 1) * f + self.hidden if self.mlp_bias else 0
        return self.mlp_matrices * self.hidden * f + bias

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections with their biases (or MLA's, :meth:`MLA.params`),
        Qwen3's query and key norms (``2d``) and GPT-OSS's sinks (``a``)."""
        h, qw, kvw = self.hidden, self.q_width, self.kv_width
        extra = (2 * self.d if self.qk_norm else 0) + (self.heads if self.attention_sinks else 0)
        if self.mla is not None:
            return self.mla.params(h, self.heads) + extra
        qkv = h * (qw + 2 * kvw) + ((qw + 2 * kvw) if self.qkv_bias else 0)
        return qkv + qw * h + (h if self.out_bias else 0) + extra

    def tp_rank_params(self, params: float, tp: int) -> float:
        """``params`` of one layer on one of ``tp`` Megatron 1-D ranks: a ``tp``-th, but MLA's
        down projections, which every rank holds whole (Megatron-Core's duplicated
        ``TELinear``, ddlsim/workloads/decoder/partition/mla_1d.py)."""
        whole = self.mla.down_params(self.hidden) if self.mla is not None and tp > 1 else 0
        return (params - whole) / tp + whole

    @property
    def out_proj_params(self) -> int:
        """The attention output projection's weight and bias."""
        width = self.heads * self.mla.v_head_dim if self.mla is not None else self.q_width
        return width * self.hidden + (self.hidden if self.out_bias else 0)

    @property
    def norm_params(self) -> int:
        """One norm: ``h`` (RMSNorm) or ``2h`` (LayerNorm)."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts + (self.experts if self.router_bias else 0)

    @property
    def shared_params(self) -> int:
        gate = self.hidden if self.shared_expert_gate and self.shared_experts else 0
        return self.shared_experts * self.mlp_params(self.f_s) + gate

    def layer_modules(self, tp: int = 1) -> tuple[tuple[float, ...], ...]:
        """A dense layer's parameter tensors on one of ``tp`` tensor-parallel ranks, by leaf
        module in forward order (Megatron-LM's layout): input norm, fused QKV projection,
        attention output, post-attention norm, first MLP GEMM (gate and up fused), second MLP
        GEMM. Column-parallel weights and biases and row-parallel weights hold ``1/tp``;
        norms and row-parallel biases are replicated. Summed over ``tp`` ranks they count
        :attr:`dense_layer_params` with the replicated tensors ``tp`` times."""
        h, qw, kvw, f = self.hidden, self.q_width, self.kv_width, self.ffn
        up = (self.mlp_matrices - 1) * f
        norm = (float(h),) * (2 if self.norm == "layernorm" else 1)

        def linear(weight: float, bias: float, has_bias: bool) -> tuple[float, ...]:
            return (weight, bias) if has_bias else (weight,)

        qkv = linear(h * (qw + 2 * kvw) / tp, (qw + 2 * kvw) / tp, self.qkv_bias)
        if self.mla is not None or self.qk_norm or self.attention_sinks:
            qkv = ((self.attention_params - self.out_proj_params) / tp,)   # one module's worth
        return (norm, qkv,
                linear((self.out_proj_params - (h if self.out_bias else 0)) / tp, float(h),
                       self.out_bias),
                norm,
                linear(h * up / tp, up / tp, self.mlp_bias),
                linear(f * h / tp, float(h), self.mlp_bias))

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + 2 * self.norm_params + self.mlp_params(self.ffn)

    @property
    def moe_layer_params(self) -> int:
        return (self.attention_params + 2 * self.norm_params + self.router_params
                + self.experts * self.mlp_params(self.f_e) + self.shared_params)

    @property
    def layer_params(self) -> int:
        """Parameters of one layer when all layers are alike (dense, or MoE everywhere)."""
        return self.moe_layer_params if self._uniform(None) else self.dense_layer_params

    @property
    def stack_params(self) -> int:
        """Parameters of all ``L`` layers."""
        return self.dense_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params

    @property
    def embedding_params(self) -> int:
        """Input embedding, learned positions, and the output head when untied."""
        pos = self.max_positions * self.hidden if self.positions == "learned" else 0
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + pos + head

    @property
    def params(self) -> int:
        """Total parameters: layers, embeddings (and head), final norm."""
        return self.stack_params + self.embedding_params + self.norm_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches: an MoE layer counts its router, ``top_k`` of its
        experts and its shared experts (Mixtral 8x7B: 12,879,925,248 of 46,702,792,704)."""
        moe_active = (self.attention_params + 2 * self.norm_params + self.router_params
                      + self.top_k * self.mlp_params(self.f_e) + self.shared_params)
        return (self.dense_layers * self.dense_layer_params + self.moe_layers * moe_active
                + self.embedding_params + self.norm_params)
