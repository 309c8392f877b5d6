"""Model sections of the decoder family, with HuggingFace ``config.json`` field names.

Two arms of the union discriminated on ``architecture``:

* ``gpt``: GPT-2/GPT-3/Megatron GPT: LayerNorm, learned positions, GeLU MLP, biases,
  multi-head attention; tied embeddings unless ``tie_word_embeddings: false``.
* ``llama``: Llama/Mistral/Qwen2: RMSNorm, rotary positions, gated MLP (SwiGLU with
  ``hidden_act: silu``, GeGLU with ``gelu``), grouped-query attention
  (``num_key_value_heads``), untied embeddings unless ``tie_word_embeddings: true``, no
  biases unless ``attention_bias`` (q, k, v, o), ``qkv_bias`` (q, k, v only: Qwen2) or
  ``mlp_bias``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from ...config import ModelBase, count_type
from ..models.decoder import DecoderShape

__all__ = ["GPTModel", "LlamaModel", "GATED_ACTIVATIONS"]

#: Non-linearities of a gated MLP (HuggingFace ACT2FN names): SiLU → SwiGLU, GeLU → GeGLU.
GATED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh",
                     "relu")


class GPTModel(ModelBase):
    """A GPT: LayerNorm, learned positions, GeLU MLP, biases, multi-head attention."""

    architecture: Literal["gpt"] = "gpt"
    num_hidden_layers: count_type("layers")
    hidden_size: count_type("hidden_size")
    num_attention_heads: count_type("heads")
    intermediate_size: count_type("intermediate_size") | None = Field(
        default=None, description="default 4·hidden_size")
    vocab_size: count_type("vocab_size")
    max_position_embeddings: count_type("seq_length")
    tie_word_embeddings: StrictBool = True

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def shape(self) -> DecoderShape:
        """The closed-form counts of this model."""
        return DecoderShape(self.num_hidden_layers, self.hidden_size, self.num_attention_heads,
                            self.ffn_size, self.vocab_size, self.max_position_embeddings,
                            tied_embeddings=self.tie_word_embeddings)


class LlamaModel(ModelBase):
    """A Llama-style decoder (Llama 2/3, Mistral, Qwen2)."""

    architecture: Literal["llama"] = "llama"
    num_hidden_layers: count_type("layers")
    hidden_size: count_type("hidden_size")
    num_attention_heads: count_type("heads")
    num_key_value_heads: count_type("heads") | None = Field(
        default=None, description="default num_attention_heads (multi-head attention)")
    head_dim: count_type("hidden_size") | None = Field(
        default=None, description="default hidden_size / num_attention_heads")
    intermediate_size: count_type("intermediate_size")
    vocab_size: count_type("vocab_size")
    max_position_embeddings: count_type("seq_length") | None = None
    tie_word_embeddings: StrictBool = False
    hidden_act: Literal[GATED_ACTIVATIONS] = "silu"
    attention_bias: StrictBool = False
    qkv_bias: StrictBool | None = Field(
        default=None, description="biases on q, k, v only (Qwen2); default attention_bias")
    mlp_bias: StrictBool = False

    @model_validator(mode="after")
    def _check(self) -> "LlamaModel":
        a, g = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        if a % g:
            raise ValueError(f"num_attention_heads = {a} is not a multiple of "
                             f"num_key_value_heads = {g}: each key/value head serves a whole "
                             "group of query heads")
        if self.head_dim is None and self.hidden_size % a:
            raise ValueError(f"hidden_size = {self.hidden_size} is not a multiple of "
                             f"num_attention_heads = {a}; give head_dim")
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
            out_bias=self.attention_bias, mlp_bias=self.mlp_bias, dropout=False)
