"""The device kernels of a BERT layer, its embeddings and its pre-training heads, as PyTorch
runs NVIDIA DeepLearningExamples' ``modeling.py`` (HuggingFace's ``BertLayer`` with separate
query, key and value projections), for the kernel-level compute model
(:mod:`ddlsim.simulator.kernels`): each GEMM timed by its shape, each element-wise op one memory
pass paying its launch (:mod:`ddlsim.simulator.kernels.host`).

Per layer and micro-batch of ``b`` sequences of ``s`` tokens (``x`` = ``b·s·h`` hidden
states, ``y`` = ``b·s·f`` FFN activations, ``S`` = ``b·a·s²`` attention scores, ``d`` bytes
per element), forward, in ``BertSelfAttention.forward``, ``BertSelfOutput``, ``BertIntermediate`` and
``BertOutput`` order (DeepLearningExamples 729963dd ``PyTorch/LanguageModeling/BERT/modeling.py``
lines 340-435; the same sequence at 78ec6802):

==========================  ======================================  ==========================
op                          kernel                                  bytes
==========================  ======================================  ==========================
query, key, value, dense,   ``F.linear``: GEMM ``(b·s, h, h)`` ×4,  by shape (:mod:`.gemm`)
FFN in, FFN out             ``(b·s, f, h)``, ``(b·s, h, f)``
QKᵀ, P·V                    ``torch.bmm`` over ``b·a``:             by shape
                            ``(s, s, h/a)``, ``(s, h/a, s)``
``/ sqrt(d_head)``          read + write S                          ``2d·S``
``+ attention_mask``        read + write S (mask broadcast)         ``2d·S``
softmax                     read + write S                          ``2d·S``
dropout on the probs        read + write S, 1-byte mask             ``(2d+1)·S``
context ``.contiguous()``   copy                                    ``2d·x``
dropout (×2)                read + write, 1-byte mask               ``(2d+1)·x``
residual add (×2)           read two, write one                     ``3d·x``
LayerNorm (×2)              one kernel (apex FusedLayerNorm at      ``2d·x``
                            78ec6802; torch's native kernel at
                            729963dd)
(bias-)GeLU                 one kernel (``F.gelu`` after the bias   ``2d·y``
                            add at 78ec6802, whose training
                            swaps in ``bias_gelu_training``;
                            NVFuser's bias-GeLU under
                            ``torch.jit.script`` at 729963dd)
==========================  ======================================  ==========================

The softmax and the dropout over the scores move their bytes at the device's score-pass
bandwidth (``variant="scores"``: ``device.score_pass_efficiency``, derived where one is
published from Megatron's attention core, whose fused kernel scales, masks and soft-maxes in
one pass, then dropout); the scale and the mask add, which that kernel fused and this code runs
as PyTorch element-wise kernels of their own, at the streaming bandwidth, as the layer's other
element-wise passes.

**Separate bias kernels** (``model.linear_bias: separate``): PyTorch 1.6's ``F.linear``
(``torch/nn/functional.py``, the 20.06 container's) fuses the bias into ``addmm`` only for a
2-D input; on BERT's 3-D hidden states it runs ``input.matmul(weight.t())`` then
``output += bias``, one more read + write of the output (``2d·x``) for query, key, value,
the attention output and the FFN output projections; 78ec6802's training activation
(``bias_gelu_training``, ``run_pretraining.py`` line 350) adds the FFN-in bias out of place
(``bias + y``: ``2d·y``) before ``F.gelu``. Their backward reduces each bias's gradient over
the tokens (autograd's ``sum_to_size``): one kernel reading the output's gradient (``d·x``
or ``d·y``). The heads do the same for the MLM transform (``T·h``) and the decoder's
``+ self.bias`` over the ``T·V`` logits. With ``fused`` (the default) the bias costs no
kernel of its own (a GEMM epilogue).

The backward runs two GEMMs per forward GEMM (:func:`~ddlsim.simulator.kernels.gemm.
gemm_kernels_backward`; for the two ``bmm`` their operand gradients) and each memory pass
at twice its forward traffic, as :func:`~ddlsim.simulator.kernels.elementwise.backward_kernels`
takes it. The heads: the MLM transform (GEMM ``(T, h, h)``, GeLU, LayerNorm) and decoder
(``(T, V, h)``) over ``T`` = ``b ×`` :meth:`~.schema.BertModel.mlm_tokens` tokens, the
cross-entropy's ``log_softmax`` and ``nll_loss`` over the ``T·V`` logits, the pooler
(``(b, h, h)``, tanh) and the NSP classifier (``(b, 2, h)``). The embeddings: three gathers,
two adds, LayerNorm and dropout over ``x``.
"""

from __future__ import annotations

from ...simulator.kernels.elementwise import backward_kernels
from ...simulator.kernels.gemm import gemm_kernels_backward
from ..trace import Kernel

__all__ = ["layer_kernels", "head_kernels", "embedding_kernels", "bias_kernels"]


def _gemms(shapes, dtype: str, backward: bool, batch: float = 1.0, variant: str = ""
           ) -> tuple[Kernel, ...]:
    """GEMM kernels of ``shapes`` ``(M, N, K)``, or of their backward (two each)."""
    if backward:
        shapes = [g for shape in shapes for g in gemm_kernels_backward(*shape)]
    return tuple(Kernel("gemm", tuple(map(float, g)), batch, dtype=dtype, variant=variant)
                 for g in shapes)


def _memory(passes, dtype: str, backward: bool, variant: str = "") -> tuple[Kernel, ...]:
    """Memory kernels moving ``passes`` bytes each, or their backward (twice each)."""
    fwd = tuple(Kernel("memory", bytes=float(v), dtype=dtype, variant=variant) for v in passes)
    return backward_kernels(fwd) if backward else fwd


def bias_kernels(outputs, d: float, dtype: str, backward: bool) -> tuple[Kernel, ...]:
    """Separate bias kernels (module docstring) of projections with ``outputs`` elements
    each: forward a read + write of each output (``2d·n``), backward one reduction reading
    each output's gradient (``d·n``).

    Parameters
    ----------
    outputs : iterable of float
        elements of each biased projection's output.
    d : float
        bytes per activation element (B).
    dtype : str
        the activations' dtype.
    backward : bool
        the bias gradients instead of the adds.

    Returns
    -------
    tuple of Kernel
        memory kernels, one per projection.
    """
    k = 1.0 if backward else 2.0
    return tuple(Kernel("memory", bytes=float(k * d * n), dtype=dtype) for n in outputs)


def layer_kernels(model, b: int, s: int, d: float, dtype: str, backward: bool
                  ) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...], tuple[Kernel, ...]]:
    """(dense GEMMs, attention core, element-wise passes) of one encoder layer (module
    docstring), forward or ``backward``.

    Parameters
    ----------
    model : BertModel
        the model section (hidden size, FFN, heads).
    b, s : int
        sequences per micro-batch and tokens per sequence.
    d : float
        bytes per activation element (B).
    dtype : str
        the GEMMs' arithmetic precision (a key of the device's peak FLOP/s).
    backward : bool
        the backward's kernels instead of the forward's.

    Returns
    -------
    tuple of three tuples of Kernel
    """
    h, f, a = model.hidden_size, model.ffn, model.num_attention_heads
    t, dh = b * s, h // a
    dense = _gemms([(t, h, h)] * 4 + [(t, f, h), (t, h, f)], dtype, backward)
    scores = b * a * s * s
    core = (_gemms([(s, s, dh), (s, dh, s)], dtype, backward, b * a, "scores")
            + _memory([2 * d * scores] * 2, dtype, backward)               # scale, mask add
            + _memory([2 * d * scores, (2 * d + 1) * scores], dtype, backward,
                      "scores"))                                           # softmax, dropout
    x, y = t * h, t * f
    elementwise = _memory([2 * d * x] + [(2 * d + 1) * x, 3 * d * x, 2 * d * x] * 2
                          + [2 * d * y], dtype, backward)
    if model.linear_bias == "separate":   # Q, K, V, out, FFN in, out
        elementwise += bias_kernels([x] * 4 + [y, x], d, dtype, backward)
    return dense, core, elementwise


def head_kernels(model, b: int, s: int, d: float, dtype: str, backward: bool
                 ) -> tuple[Kernel, ...]:
    """The pre-training heads' kernels (module docstring), forward or ``backward``; the
    cross-entropy's ``log_softmax`` reads and writes the logits, its backward reads the output
    and its gradient and writes one, ``nll_loss``'s backward writes the logits' gradient.

    Parameters
    ----------
    model : BertModel
        the model section (hidden size, vocabulary, :meth:`~.schema.BertModel.mlm_tokens`).
    b, s : int
        sequences per micro-batch and tokens per sequence.
    d : float
        bytes per activation element (B).
    dtype : str
        the GEMMs' arithmetic precision.
    backward : bool
        the backward's kernels instead of the forward's.

    Returns
    -------
    tuple of Kernel
        GEMMs (MLM transform, decoder, pooler, NSP), then memory passes.
    """
    h, v = model.hidden_size, model.vocab_size
    tokens = b * model.mlm_tokens(s)
    gemms = _gemms([(tokens, h, h), (tokens, v, h), (b, h, h), (b, 2, h)], dtype, backward)
    passes = [2 * d * tokens * h] * 2 + [2 * d * b * h]          # GeLU, LayerNorm, tanh
    logits = tokens * v
    loss = [4 * d * logits, d * logits] if backward else [2 * d * logits]
    gather = [2 * d * tokens * h] if tokens < b * s else []     # the masked tokens' rows
    bias = (bias_kernels([tokens * h, logits], d, dtype, backward)
            if model.linear_bias == "separate" else ())
    return (gemms + _memory(passes + gather, dtype, backward) + bias
            + _memory(loss, dtype, False))


def embedding_kernels(model, b: int, s: int, d: float, dtype: str, backward: bool
                      ) -> tuple[Kernel, ...]:
    """The embeddings' kernels: word, position and token-type gathers (each writes ``x``),
    two adds, LayerNorm and dropout; their backward at twice the traffic.

    Parameters
    ----------
    model : BertModel
        the model section (hidden size).
    b, s : int
        sequences per micro-batch and tokens per sequence.
    d : float
        bytes per activation element (B).
    dtype : str
        the activations' dtype.
    backward : bool
        the backward's kernels instead of the forward's.

    Returns
    -------
    tuple of Kernel
        memory kernels.
    """
    x = b * s * model.hidden_size
    return _memory([d * x] * 3 + [3 * d * x] * 2 + [2 * d * x, (2 * d + 1) * x], dtype,
                   backward)
