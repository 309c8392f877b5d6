"""GPT (decoder-only transformer) arithmetic: parameters, FLOPs, bytes, activation memory.

Notation: ``b`` micro-batch size, ``s`` sequence length, ``h`` hidden size, ``f`` FFN size,
``a`` attention heads, ``V`` vocabulary, ``L`` layers, ``t`` tensor-parallel size.

* Parameters (per layer): QKV ``3h² + 3h``, attention output ``h² + h``, MLP ``2hf + f + h``,
  two LayerNorms ``4h``; embeddings ``Vh + s_max·h``; final LayerNorm ``2h``. With f = 4h this
  is Narayanan et al. 2021 eq. (2): ``12Lh²(1 + 13/(12h) + (V + s)/(12Lh))``.
* Forward FLOPs per layer: ``24bsh² + 4bs²h`` for f = 4h (QKV 6bsh², QKᵀ 2bs²h, attention·V
  2bs²h, projection 2bsh², MLP 4bshf); logits ``2bshV``; backward = 2 × forward
  (Narayanan et al. 2021, §5.1 and Appendix; Kaplan et al. 2020 for the 6N rule).
* Activation memory per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", Table 2, 16-bit activations): ``sbh(10 + 24/t + 5as/(ht))``
  with TP; ``sbh/t · (34 + 5as/h)`` with TP + sequence parallel; selective recomputation drops
  the ``5as/h`` term; full recomputation keeps only the layer input ``2sbh`` (``/t`` with SP).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelConfig

__all__ = ["GPTShape"]


@dataclass(frozen=True, slots=True)
class GPTShape:
    """Closed-form counts for one GPT model."""

    L: int
    h: int
    a: int
    f: int
    V: int
    s_max: int

    @classmethod
    def of(cls, m: ModelConfig) -> "GPTShape":
        return cls(m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.ffn_size,
                   m.vocab_size, m.max_position_embeddings)

    # ------------------------------------------------------------------ parameters
    @property
    def layer_params(self) -> int:
        h, f = self.h, self.f
        return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h

    @property
    def embedding_params(self) -> int:
        return self.V * self.h + self.s_max * self.h

    @property
    def params(self) -> int:
        """Total parameters with tied input/output embeddings."""
        return self.L * self.layer_params + self.embedding_params + 2 * self.h

    # ------------------------------------------------------------------ FLOPs (forward)
    def layer_gemm_flops(self, b: int, s: int) -> dict[str, float]:
        """Forward FLOPs of one layer's GEMMs, unsharded, by part."""
        h, f = self.h, self.f
        return {
            "qkv": 6.0 * b * s * h * h,
            "attn_core": 4.0 * b * s * s * h,  # QKᵀ and attention·V
            "proj": 2.0 * b * s * h * h,
            "mlp": 4.0 * b * s * h * f,
        }

    def layer_forward_flops(self, b: int, s: int) -> float:
        return sum(self.layer_gemm_flops(b, s).values())

    def logits_forward_flops(self, b: int, s: int) -> float:
        return 2.0 * b * s * self.h * self.V

    def model_flops(self, batch: int, s: int) -> float:
        """Training FLOPs of one iteration without recomputation: 3 × forward."""
        return 3.0 * batch * (self.L * self.layer_forward_flops(1, s) + self.logits_forward_flops(1, s))

    # ------------------------------------------------------------------ memory traffic
    def layer_elementwise_bytes(self, b: int, s: int, t: int, sp: bool, dtype_bytes: int) -> float:
        """Bytes read+written by one layer's forward non-GEMM ops on one TP rank: two
        LayerNorms, GeLU, three dropouts, two residual adds (on ``bsh`` or ``bsh/t`` with SP),
        and softmax + mask + dropout on the ``b·a·s²/t`` attention scores."""
        seq = b * s * self.h / (t if sp else 1)
        hidden = 2 * 2 * seq + 3 * 2 * seq + 2 * 3 * seq  # LN ×2, dropout ×3, residual ×2 (r+w)
        gelu = 2 * b * s * self.f / t
        scores = 3 * 2 * b * self.a * s * s / t  # softmax, mask, dropout (read + write each)
        return dtype_bytes * (hidden + gelu + scores)

    # ------------------------------------------------------------------ activations
    def layer_activation_bytes(self, b: int, s: int, t: int, sp: bool, recompute: str) -> float:
        """Activation bytes one layer keeps for backward on one TP rank (Korthikanti 2022)."""
        sbh = s * b * self.h
        attn = 5.0 * self.a * s / self.h
        if recompute == "full":
            return 2.0 * sbh / (t if sp else 1)
        if recompute == "selective":
            attn = 0.0
        if sp:
            return sbh / t * (34.0 + attn)
        return sbh * (10.0 + 24.0 / t + attn / t)
