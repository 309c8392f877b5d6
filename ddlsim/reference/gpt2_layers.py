"""The numpy layers of the reference GPT-2 (:mod:`.gpt2`), forward and backward, in place
where numpy can: LayerNorm, the causal softmax, GPT-2's tanh GeLU, and the attention
gradient's layout copy.

Each is one function of arrays, so :mod:`.kernels` times the same calls as microbenchmarks of
ddlsim's element-wise kernel classes (docs/compute.md).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LN_EPS", "GELU_C", "rowdot", "layernorm", "layernorm_back", "softmax",
           "softmax_back", "heads_to_rows", "gelu", "gelu_back"]

#: LayerNorm's epsilon: GPT-2's ``layer_norm_epsilon`` 1e-5 (llm.c's ``layernorm_forward``)
LN_EPS = 1e-5
#: sqrt(2/pi), the tanh GeLU's constant (Hendrycks & Gimpel 2016)
GELU_C = math.sqrt(2.0 / math.pi)


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot product over the last axis, kept as a column: one read of each input,
    no temporary (``(a * b).sum(-1)`` writes and rereads the product: 5.7x slower on a
    512 x 512 float32 pair here)."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray):
    """LayerNorm over the last axis; numpy's passes in place where it can (statistics,
    normalise, affine: the steps ddlsim's unfused LayerNorm counts, docs/compute.md)."""
    xhat = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(rowdot(xhat, xhat) / x.shape[-1] + LN_EPS)
    xhat *= rstd
    out = xhat * w
    out += b
    return out, (xhat, rstd)


def layernorm_back(dy: np.ndarray, w: np.ndarray, cache, dw: np.ndarray, db: np.ndarray):
    """The gradient of LayerNorm's input from that of its output ``dy``, with the
    ``cache`` :func:`layernorm` returned; the weight's and bias's gradients are added into
    ``dw`` and ``db``."""
    xhat, rstd = cache
    dw += np.einsum("ij,ij->j", dy, xhat)
    db += dy.sum(axis=0)
    g = dy * w
    out = xhat * (rowdot(g, xhat) / g.shape[-1])
    out += g.mean(axis=-1, keepdims=True)
    np.subtract(g, out, out=out)
    out *= rstd
    return out


def softmax(att: np.ndarray, mask: np.ndarray, scale: np.float32) -> np.ndarray:
    """The causal softmax of the scores ``att`` (``[b, heads, s, s]``), in place: scale, add
    the mask, subtract the row maximum, exponentiate, normalise."""
    att *= scale
    att += mask
    att -= att.max(axis=-1, keepdims=True)
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
    return att


def softmax_back(datt: np.ndarray, att: np.ndarray, scale: np.float32) -> np.ndarray:
    """The gradient of the scores from that of the probabilities ``datt`` (in place) and
    the probabilities ``att``: ``scale · att · (datt − rowsum(datt · att))``."""
    datt -= rowdot(datt, att)
    datt *= att
    datt *= scale
    return datt


def heads_to_rows(parts, B: int, T: int, h: int) -> np.ndarray:
    """The ``[B, heads, T, d]`` gradients of q, k and v as the ``[B·T, 3h]`` gradient of the
    fused QKV output: one layout copy, as ddlsim's unfused attention counts (numpy's
    ``stack`` and then a transposed ``reshape`` made two, the second strided: 4.1 against
    0.35 ms per layer of the loop's model, 2026-11-29)."""
    out = np.empty((B, T, len(parts), *parts[0].shape[1:2], parts[0].shape[-1]),
                   dtype=parts[0].dtype)
    for i, x in enumerate(parts):
        out[:, :, i] = x.transpose(0, 2, 1, 3)
    return out.reshape(B * T, len(parts) * h)


def gelu(x: np.ndarray):
    """GPT-2's tanh GeLU of ``x`` and the tanh it saves for the backward, in place where
    numpy can: ``t = tanh(C·x·(1 + 0.044715·x²))``, ``0.5·x·(1 + t)``."""
    t = x * x
    t *= 0.044715 * GELU_C
    t += GELU_C
    t *= x
    np.tanh(t, out=t)
    out = t + 1.0
    out *= x
    out *= 0.5
    return out, t


def gelu_back(dy: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``dy · d/dx gelu(x) = dy · (0.5·(1 + t) + 0.5·x·(1 − t²)·C·(1 + 3·0.044715·x²))``."""
    g = t * t
    np.subtract(1.0, g, out=g)
    u = x * x
    u *= 3 * 0.044715 * GELU_C
    u += GELU_C
    g *= u
    g *= x
    g += t
    g += 1.0
    g *= 0.5
    g *= dy
    return g
