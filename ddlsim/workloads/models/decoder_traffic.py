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
    * MoE layer: the dense MLP's tensors are replaced by, per routed copy of a token
      (``k`` of them), its dispatched input ``2sbh``, the expert's intermediates (``4sbf_e``
      or ``6sbf_e``) and its output ``2sbh`` (kept to differentiate the gate-weighted
      combine), plus router logits ``2sbE`` and the shared experts' intermediates. With
      balanced routing an expert-parallel rank receives as many token copies as it sends,
      so the count per rank does not depend on the EP size.

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
                               repeat_kv: bool = False) -> float:
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
        ``selective`` recomputation, whose checkpointed core keeps its inputs unrepeated."""
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
        if self._uniform(moe):
            k = self.top_k
            split += per_tok * sb * (k * self.f_e + self.shared_experts * self.f_s)
            replicated += 2 * k * 2 * sb * h + 2 * sb * self.experts
        else:
            split += per_tok * sb * self.ffn
        scores = 0.0 if recompute == "selective" else (
            4.0 * self.heads * s * b if flash else (5 if self.dropout else 2) * self.heads * s * s * b)
        if fp8 and not self._uniform(moe):   # 1 byte saved per linear GEMM input element kept
            replicated, split = replicated - 2 * sb * h, split - sb * (self.q_width + self.ffn)
        if sp and gathered_input:   # the inputs whole: (1 - 1/t) more of each (none at t = 1)
            per_input = 1 if fp8 and not self._uniform(moe) else 2
            gathered = (1 if self._uniform(moe) else 2) * per_input * sb * h
            replicated += gathered * (t - 1)      # / t below: the whole input per rank
        if sp:
            return (replicated + split + scores) / t
        return replicated + (split + scores) / t
