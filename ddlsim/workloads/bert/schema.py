"""The ``bert`` model section: a BERT encoder with its pre-training heads (Devlin et al. 2019).

Parameters follow HuggingFace ``BertForPreTraining`` (``modeling_bert.py``) tensor by tensor,
in registration order: the embeddings (word, position, token type, LayerNorm), per layer
the query/key/value/output projections with biases, the attention LayerNorm, the two FFN
matrices with biases and the output LayerNorm (16 tensors), then the pooler, the MLM head
(its output bias, transform dense and LayerNorm, and its decoder matrix when it is not tied to
the word embeddings) and the next-sentence classifier. BERT-large (24 × 1024, 16 heads, FFN
4096, vocab 30522, 512 positions, 2 token types) has 335,141,888 parameters without the
pre-training heads (``BertModel``) and 336,226,108 with them, tied.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from ...config import ModelBase, count_type
from ..freshbuffers import RECV_BUFFERS_FIELD, RecvBuffers
from ..proxytime import TIMINGS_FIELD, ComputeMode, ProxyTimings, check_proxy_timings

__all__ = ["BertModel", "PROXY_TIMINGS", "LAYER_TENSORS"]

#: ``compute: proxy`` timings, per micro-batch and stage (a comm_only proxy: ``0 s`` each).
PROXY_TIMINGS = ("forward_per_microbatch", "backward_per_microbatch")
#: Trainable tensors of one encoder layer (HuggingFace ``BertLayer``).
LAYER_TENSORS = 16


class BertModel(ModelBase):
    """A BERT encoder with MLM + NSP heads, trained data parallel or pipeline + data parallel.

    Departures a proxy needs are explicit fields (defaults: HuggingFace BERT and PyTorch DDP):
    ``tie_word_embeddings: false`` (an MLM decoder matrix of its own), ``grad_buckets:
    per_layer`` (one all-reduce per layer), ``p2p_attention_mask`` (the pipeline sends the
    attention mask with the hidden states), ``stage_exchange: paired`` (a stage posts its send
    and its receive of a micro-batch together and waits for both), ``recv_buffers: fresh``
    (a new receive buffer every iteration, comm_only/bert_large.cpp:63-64: its first receive
    faults the pages in, :mod:`ddlsim.workloads.freshbuffers`). The training step's
    kernels a stack adds are fields too: ``linear_bias`` and ``grad_accumulation``.
    """

    architecture: Literal["bert"] = "bert"
    num_hidden_layers: count_type("layers")
    hidden_size: count_type("hidden_size")
    num_attention_heads: count_type("heads")
    intermediate_size: count_type("intermediate_size") | None = Field(
        default=None, description="default 4·hidden_size")
    vocab_size: count_type("vocab_size")
    max_position_embeddings: count_type("seq_length") = 512
    type_vocab_size: count_type("vocab_size") = 2
    tie_word_embeddings: StrictBool = True
    grad_buckets: Literal["ddp", "per_layer"] = Field(
        default="ddp", description="ddp: PyTorch's size rule; per_layer: one all-reduce per "
                                   "layer, embeddings with the first, heads with the last")
    p2p_attention_mask: StrictBool = Field(
        default=False, description="pipeline messages carry the b·s attention mask too")
    stage_exchange: Literal["dependent", "paired"] = Field(
        default="dependent", description="paired: post a micro-batch's send and receive "
                                         "together and wait for both")
    recv_buffers: RecvBuffers = RECV_BUFFERS_FIELD
    mlm_predictions_per_seq: count_type("seq_length") | None = Field(
        default=None, description="tokens per sequence the MLM transform and decoder run "
                                  "over: the masked ones only, gathered before the head "
                                  "(NVIDIA DeepLearningExamples' dense sequence output); "
                                  "default: every token")
    linear_bias: Literal["fused", "separate"] = Field(
        default="fused", description="separate: each projection's bias is one more kernel "
                                     "(PyTorch 1.6's F.linear on 3-D input: matmul, then "
                                     "+= bias) and its gradient one reduction "
                                     "(bert/kernels.py); fused: no kernel of its own")
    grad_accumulation: Literal["none", "autograd", "apex_master"] = Field(
        default="none", description="how a micro-batch's gradients join the step's: "
                                    "autograd (AccumulateGrad, in place), apex_master (apex "
                                    "amp O2's unscale into fp32 master gradients), none (not "
                                    "counted); bert/step.py")
    compute: ComputeMode = "model"
    proxy_timings: ProxyTimings = TIMINGS_FIELD

    @model_validator(mode="after")
    def _check(self) -> "BertModel":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size = {self.hidden_size} is not a multiple of "
                             f"num_attention_heads = {self.num_attention_heads}")
        check_proxy_timings(self.compute, self.proxy_timings, PROXY_TIMINGS, "bert")
        if self.recv_buffers == "fresh" and self.stage_exchange != "paired":
            raise ValueError("model.recv_buffers = 'fresh' needs stage_exchange: paired (the "
                             "comm_only/bert_large.cpp exchange, whose Waitall the first "
                             f"touch follows); got stage_exchange {self.stage_exchange!r}")
        return self

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def layer_tensors(self) -> list[int]:
        """Elements of one layer's 16 tensors, in registration order."""
        h, f = self.hidden_size, self.ffn
        return [h * h, h, h * h, h, h * h, h, h * h, h, h, h, h * f, f, f * h, h, h, h]

    def embedding_tensors(self) -> list[int]:
        """Word, position and token-type embeddings, then the LayerNorm weight and bias."""
        h = self.hidden_size
        return [self.vocab_size * h, self.max_position_embeddings * h,
                self.type_vocab_size * h, h, h]

    def head_tensors(self, pp: int = 1) -> list[int]:
        """Pooler dense, MLM (output bias, transform dense, LayerNorm, decoder) and NSP on the
        last of ``pp`` stages: the decoder is its own ``V·h`` when untied, and when tied at
        PP > 1 (Megatron-LM 6985e58 ``megatron/model/module.py``
        ``initialize_word_embeddings``: a copy of the word embeddings on the last stage)."""
        h, v = self.hidden_size, self.vocab_size
        decoder = [] if self.tie_word_embeddings and pp == 1 else [v * h]
        return [h * h, h, v, h * h, h, h, h, *decoder, 2 * h, 2]

    def stage_tensors(self, stage: int, pp: int) -> list[int]:
        """Tensors of pipeline ``stage`` of ``pp`` in registration order."""
        per = self.num_hidden_layers // pp
        out = self.embedding_tensors() if stage == 0 else []
        out += self.layer_tensors() * per
        return out + (self.head_tensors(pp) if stage == pp - 1 else [])

    @property
    def params(self) -> int:
        """Trainable parameters (tied decoder counted once)."""
        return sum(self.stage_tensors(0, 1))

    def layer_flops(self, b: int, s: int) -> tuple[float, float]:
        """Forward FLOPs of one layer on ``b`` sequences of ``s`` tokens: (GEMMs, attention
        score and context products)."""
        h = self.hidden_size
        return 2.0 * b * s * (4 * h * h + 2 * h * self.ffn), 4.0 * b * s * s * h

    def mlm_tokens(self, s: int) -> int:
        """Tokens per sequence of ``s`` the MLM head runs over: every one, or the
        ``mlm_predictions_per_seq`` masked ones gathered before it."""
        m = self.mlm_predictions_per_seq
        return s if m is None else min(s, m)

    def head_flops(self, b: int, s: int) -> float:
        """Forward FLOPs of the pooler, the MLM transform and decoder over
        :meth:`mlm_tokens` tokens per sequence, NSP."""
        h = self.hidden_size
        return (2.0 * b * (h * h + 2 * h)
                + 2.0 * b * self.mlm_tokens(s) * (h * h + h * self.vocab_size))

    def forward_flops(self, s: int) -> float:
        """Forward FLOPs of one sequence of ``s`` tokens."""
        gemm, attn = self.layer_flops(1, s)
        return self.num_hidden_layers * (gemm + attn) + self.head_flops(1, s)

    def summary_line(self) -> str:
        tied = "tied" if self.tie_word_embeddings else "untied"
        masked = ("" if self.mlm_predictions_per_seq is None else
                  f", MLM head over {self.mlm_predictions_per_seq} masked tokens per sequence")
        return (f"{self.name}: BERT encoder, {self.num_hidden_layers} layers, h "
                f"{self.hidden_size}, {self.num_attention_heads} heads, FFN {self.ffn}, vocab "
                f"{self.vocab_size} ({tied} MLM decoder{masked}), "
                f"{self.params / 1e6:.1f} M params")
