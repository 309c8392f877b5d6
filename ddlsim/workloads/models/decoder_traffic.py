"""The memory side of :class:`~.decoder.DecoderShape`: bytes one layer's non-GEMM ops move,
and the activation bytes it keeps for its backward.

Activation bytes one layer keeps for backward (Korthikanti et al. 2022, §4.1, 16-bit)
    The paper's per-layer ``sbh(34 + 5as/h)`` splits into: the two norms' inputs ``4sbh``;
    the shared input of the QKV GEMMs ``2sbh``; Q and K for QKᵀ ``4sbh``; V ``2sbh``; the
    output projection's input ``2sbh``; the MLP input ``2sbh``; the GeLU input and the second
    GEMM's input ``8sbh + 8sbh``; two dropout masks ``2sbh``; softmax output, its dropout mask
    and dropout output ``5as²b``. Adapted per variant:

    * GQA/MQA: K and V are ``sb·gd`` wide instead of ``sbh``: Q ``2sb·ad``, K ``2sb·gd``,
      V ``2sb·gd``, output-projection input ``2sb·ad`` (with ``ad = gd = h`` this is the
      paper's ``4 + 2 + 2``).
    * MLP of size ``f``: GeLU input and second-GEMM input ``2sbf + 2sbf``. A gated MLP keeps
      one more ``2sbf`` tensor: the first GEMM's output is gate ‖ up (``4sbf``, what
      Megatron-Core's fused SwiGLU saves) plus the down projection's input ``2sbf``.
    * No dropout (Llama, Mistral, Qwen2 train without it): no masks (``−2sbh``) and the
      scores term is only the softmax output ``2as²b``.
    * MoE layer: the dense MLP's tensors are replaced by the MoE block's
      (:meth:`DecoderTraffic.moe_block_bytes`): per routed copy of a token (``k`` of them),
      its dispatched input ``2sbh``, the expert's intermediates (``4sbf_e`` or ``6sbf_e``)
      and, where the stack weights the outputs by their probabilities at the combine, its
      output ``2sbh``; plus router logits ``2sbE`` and the shared experts' intermediates.
      With balanced routing an expert-parallel rank receives as many token copies as it
      sends, so the count per rank does not depend on the EP size.
    * Query and key norms (Qwen3's ``qk_norm``): each keeps its input, ``2sb·ad`` and
      ``2sb·gd`` beside the rotated Q and K the core keeps (Megatron-Core core_v0.14.0rc7
      ``attention.py`` ``get_query_key_value_tensors``: the query reshaped out of the fused
      QKV output is a copy, TE's RMSNorm saves its contiguous input).
    * FP8 (Transformer Engine): each linear keeps its input as the 1-byte transposed copy
      its weight gradient reads (TransformerEngine v2.7 ``module/linear.py``,
      ``layernorm_linear.py``, ``grouped_linear.py``: ``update_usage(rowwise_usage=False,
      columnwise_usage=True)`` before ``save_for_backward``), in an MoE layer the QKV's, the
      projection's and each routed copy's fc1 and fc2 inputs; the router keeps the 16-bit
      norm output.

    With tensor parallelism the tensors that are split over heads or FFN columns are divided
    by ``t`` and the rest (norm inputs, GEMM inputs, masks) replicated; with sequence
    parallelism everything is divided by ``t``. Selective recomputation drops the ``s²``
    term; full recomputation keeps only the layer input ``2sbh``.
"""

from __future__ import annotations

__all__ = ["DecoderTraffic"]


class DecoderTraffic:
    """Memory traffic and activation bytes of one layer (a mixin of ``DecoderShape``, whose
    sizes these methods read)."""

    __slots__ = ()

    # ------------------------------------------------------------------ memory traffic
    def layer_elementwise_bytes(self, b: int, s: int, t: int, sp: bool, dtype_bytes: int,
                                *, moe: bool | None = None) -> float:
        """Bytes read + written by one layer's forward non-GEMM ops on one TP rank.

        Two norms, residual adds (and three dropouts with ``dropout``) on ``bsh`` (``bsh/t``
        with SP); the MLP non-linearity (GeLU: read + write ``bsf/t``; fused SwiGLU: read gate
        and up, write ``bsf/t``); rotary embedding on Q and K; softmax + mask (+ dropout) on the
        ``b·a·s²/t`` scores. MoE: the non-linearity on ``k`` expert and the shared MLPs, token
        permutation and un-permutation (read + write ``k`` copies each), router softmax.
        """
        seq = b * s * self.hidden / (t if sp else 1)
        hidden = 2 * 2 * seq + 2 * 3 * seq + (3 * 2 * seq if self.dropout else 0)
        act = (3 if self.gated_mlp else 2) * b * s / t
        rope = 2 * b * s * self.rope_width / t if self.positions == "rotary" else 0
        if self.qk_norm:   # Qwen3's RMSNorm of every query and key head: read + write
            rope += 2 * b * s * (self.q_width + self.kv_width) / t
        scores = (3 if self.dropout else 2) * 2 * b * self.heads * s * s / t
        if self._uniform(moe):
            mlp = act * (self.top_k * self.f_e + self.shared_experts * self.f_s)
            mlp += 4 * self.top_k * seq + 2 * b * s * self.experts
        else:
            mlp = act * self.ffn
        return dtype_bytes * (hidden + mlp + rope + scores)

    # ------------------------------------------------------------------ activations
    def layer_activation_bytes(self, b: int, s: int, t: int, sp: bool, recompute: str,
                               *, moe: bool | None = None, flash: bool = False,
                               fp8: bool = False, gathered_input: bool = False,
                               repeat_kv: bool = False, moe_output_kept: bool = True) -> float:
        """Activation bytes one layer keeps for backward on one TP rank (16-bit), after
        Korthikanti et al. 2022 adapted as the module docstring derives. ``flash``: no ``s²``
        tensor, a 4-byte log-sum-exp per query row and head; ``fp8``: TE keeps the inputs of
        the four linear GEMMs (``sbh`` twice, ``sb·q/t``, ``sb·f/t``) in 1 byte;
        ``gathered_input``: under sequence parallelism the column-parallel GEMMs keep their
        all-gathered input, the whole sequence's ``sbh``, where Megatron keeps the ``sbh/t``
        shard (the QKV's, and a dense MLP's; PyTorch DTensor's autograd:
        :func:`~ddlsim.simulator.kernels.dtensor.regathers_input` false); ``repeat_kv``: the
        attention core saves K and V repeated to the query heads (``q_width`` each, not
        ``kv_width``: :func:`~ddlsim.simulator.kernels.repeat_kv.expands_kv`), except under
        ``selective`` recomputation, whose checkpointed core keeps its inputs unrepeated;
        ``moe_output_kept``: the MoE combine keeps each routed copy's expert output
        (:meth:`moe_block_bytes`)."""
        sb, h = s * b, self.hidden
        if recompute == "full":
            return 2.0 * sb * h / (t if sp else 1)
        per_tok = 4 if not self.gated_mlp else 6                 # MLP tensors, × sb·f
        replicated = sb * h * (4 + 2 + 2 + (2 if self.dropout else 0))   # norms, GEMM inputs, masks
        if self.mla is not None:   # the normalised latents the up projections read
            replicated += 2 * sb * self.mla.latent_width()
        split = 4.0 * sb * (self.q_width + self.kv_width)       # Q, K, V, projection input
        if repeat_kv and recompute != "selective":    # K and V as the core saves them
            split += 4.0 * sb * (self.q_width - self.kv_width)
        block = 0.0
        if self._uniform(moe):
            block = self.moe_block_bytes(b, s, t, sp, fp8=fp8, moe_output_kept=moe_output_kept)
        else:
            split += per_tok * sb * self.ffn
        if self.qk_norm:   # the query and key norms' inputs, beside the rotated Q and K
            split += 2.0 * sb * (self.q_width + self.kv_width)
        scores = 0.0 if recompute == "selective" else (
            4.0 * self.heads * s * b if flash else (5 if self.dropout else 2) * self.heads * s * s * b)
        if fp8 and not self._uniform(moe):   # 1 byte saved per linear GEMM input element kept
            replicated, split = replicated - 2 * sb * h, split - sb * (self.q_width + self.ffn)
        elif fp8:    # an MoE layer's QKV and projection (its block's: moe_block_bytes)
            replicated, split = replicated - sb * h, split - sb * self.q_width
        if sp and gathered_input:   # the inputs whole: (1 - 1/t) more of each (none at t = 1)
            per_input = 1 if fp8 and not self._uniform(moe) else 2
            gathered = (1 if self._uniform(moe) else 2) * per_input * sb * h
            replicated += gathered * (t - 1)      # / t below: the whole input per rank
        if sp:
            return (replicated + split + scores) / t + block
        return replicated + (split + scores) / t + block

    def moe_block_bytes(self, b: int, s: int, t: int, sp: bool, *, fp8: bool = False,
                        moe_output_kept: bool = True) -> float:
        """Activation bytes an MoE layer's block (router, dispatch, experts, combine) keeps
        for the backward on one TP rank beyond its input, the pre-MLP norm's output (which
        the router's linear keeps, counted with the layer).

        Per routed copy of a token (``k``): the first expert GEMM's input ``h`` (2 bytes,
        1 under ``fp8``), the experts' intermediates (gate ‖ up ``4f_e`` and the second
        GEMM's input ``2f_e``, 1 byte under ``fp8``; GeLU ``2f_e + 2f_e``) and, with
        ``moe_output_kept``, the expert's output ``2h``, which the probability-weighted
        combine keeps (Megatron-Core before 0.13: ``moe_utils.py`` ``unpermute``,
        ``probs * permuted_tokens``); from Megatron-Core 0.13 (Megatron-LM 2659630721) the
        experts' activation applies the probabilities (``WeightedSwiGLUFunction`` saves its
        input, the fc1 output, already counted) and the un-permutation keeps only its index
        map. Plus the router logits ``2E`` per token and the shared experts' intermediates;
        under ``fp8`` their fc1 keeps its own 1-byte copy of the block's input ``h``
        (Megatron-Core 9c1a5351 ``shared_experts.py``; later cores save the original under
        current scaling). Tensors split over heads or FFN columns are divided by ``t``, the
        rest by ``t`` only with sequence parallelism (``sp``).

        Parameters
        ----------
        b, s, t : int
            Sequences per micro-batch, tokens per sequence on the rank, TP ranks.
        sp : bool
            Sequence parallelism.
        fp8 : bool
            Transformer Engine's FP8 linears (1-byte saved inputs).
        moe_output_kept : bool
            The combine keeps each routed copy's expert output (the stack's
            ``moe_saves_expert_output``).

        Returns
        -------
        float
            Bytes.
        """
        sb, h, k = s * b, self.hidden, self.top_k
        gemm_in = 1 if fp8 else 2
        replicated = k * sb * h * (gemm_in + (2 if moe_output_kept else 0)) + 2 * sb * self.experts
        if fp8 and self.shared_experts:
            replicated += sb * h
        per_tok = (6 if self.gated_mlp else 4) - (1 if fp8 else 0)
        split = per_tok * sb * (k * self.f_e + self.shared_experts * self.f_s)
        return replicated / (t if sp else 1) + split / t
