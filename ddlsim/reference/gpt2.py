"""A GPT-2 that really trains, in numpy: forward, backward and Adam on one flat fp32 buffer.

The model is the one ddlsim's ``gpt`` family describes (``docs/models.md``): learned token
and position embeddings, ``L`` pre-LayerNorm blocks of causal multi-head attention (fused
QKV projection, output projection) and a GeLU MLP of width ``4h``, all with biases, a final
LayerNorm and an output head tied to the token embedding, cross-entropy loss; no dropout.
It follows llm.c's ``train_gpt2.c`` layer for layer (Karpathy, github.com/karpathy/llm.c),
with the tanh GeLU of GPT-2 (Hendrycks & Gimpel 2016, eq. for the approximation).

Parameters and gradients each live in one contiguous float32 buffer (views per tensor), so
a data-parallel gradient exchange is one collective on one buffer, as in llm.c. The buffer
is padded with zeros to a multiple of :data:`PAD_MULTIPLE` elements so that it splits into
equal shards for 1-8 ranks (the pad is at most 839 elements, 3.3 KiB). The layers' numpy
functions (LayerNorm, softmax, GeLU and their backwards) are in :mod:`.gpt2_layers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .gpt2_layers import (gelu, gelu_back, heads_to_rows, layernorm, layernorm_back, softmax,
                          softmax_back)

__all__ = ["GPTShape", "GPT2", "Adam", "PAD_MULTIPLE"]

#: lcm(1, …, 8): the flat buffers split into equal shards on 1-8 ranks
PAD_MULTIPLE = 840


@dataclass(frozen=True)
class GPTShape:
    """What defines the model and one micro-batch (every size in elements)."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    batch: int
    #: rows of the position embedding (``max_position_embeddings``); ``seq`` when None
    positions: int | None = None

    def __post_init__(self) -> None:
        if self.positions is None:
            object.__setattr__(self, "positions", self.seq)
        for name in ("layers", "hidden", "heads", "vocab", "seq", "batch", "positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTShape.{name} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"GPTShape.hidden {self.hidden} must be a multiple of heads "
                             f"{self.heads}")
        if self.positions < self.seq:
            raise ValueError(f"GPTShape.positions {self.positions} must be >= seq {self.seq}")

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter tensor, in buffer order."""
        h = self.hidden
        out = [("wte", (self.vocab, h)), ("wpe", (self.positions, h))]
        for i in range(self.layers):
            out += [(f"{i}.ln1_w", (h,)), (f"{i}.ln1_b", (h,)),
                    (f"{i}.qkv_w", (h, 3 * h)), (f"{i}.qkv_b", (3 * h,)),
                    (f"{i}.proj_w", (h, h)), (f"{i}.proj_b", (h,)),
                    (f"{i}.ln2_w", (h,)), (f"{i}.ln2_b", (h,)),
                    (f"{i}.fc_w", (h, 4 * h)), (f"{i}.fc_b", (4 * h,)),
                    (f"{i}.fcproj_w", (4 * h, h)), (f"{i}.fcproj_b", (h,))]
        return out + [("lnf_w", (h,)), ("lnf_b", (h,))]

    @property
    def params(self) -> int:
        """Number of parameters (without the pad)."""
        return sum(math.prod(s) for _, s in self.tensors())

    @property
    def padded(self) -> int:
        """Elements of the flat buffers: :attr:`params` rounded up to :data:`PAD_MULTIPLE`."""
        return -(-self.params // PAD_MULTIPLE) * PAD_MULTIPLE


def _views(flat: np.ndarray, shape: GPTShape) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name, dims in shape.tensors():
        n = math.prod(dims)
        out[name] = flat[at:at + n].reshape(dims)
        at += n
    return out


class GPT2:
    """The model: parameters ``p`` and gradients ``g`` (flat float32 buffers of
    :attr:`GPTShape.padded` elements) and their per-tensor views."""

    def __init__(self, shape: GPTShape, seed: int = 0, dtype: type = np.float32):
        self.shape = shape
        self.p = np.zeros(shape.padded, dtype=dtype)
        self.g = np.zeros(shape.padded, dtype=dtype)
        self.P, self.G = _views(self.p, shape), _views(self.g, shape)
        rng = np.random.default_rng(seed)
        for name, w in self.P.items():  # GPT-2's init: N(0, 0.02), LayerNorm weights 1
            if name.endswith(("ln1_w", "ln2_w", "lnf_w")):
                w[...] = 1.0
            elif not name.endswith("_b"):
                w[...] = rng.normal(0.0, 0.02, w.shape)
        self._mask = self.causal_mask(shape.seq, dtype)

    @staticmethod
    def causal_mask(seq: int, dtype: type = np.float32) -> np.ndarray:
        """The causal mask as an additive ``seq × seq`` term (0 on and below the diagonal,
        −inf above): one element-wise pass, as a masking kernel."""
        return np.where(np.triu(np.ones((seq, seq), dtype=bool), k=1), -np.inf,
                        0.0).astype(dtype)

    #: data-parallel ranks whose gradients are summed: the backward scales the loss's
    #: gradient by ``1 / (tokens · ranks)``, so that the exchange's sum is the mean gradient
    #: without a pass over the gradient buffer of its own (Megatron-LM's
    #: ``calculate_per_token_loss`` folds the division into the loss the same way; ddlsim's
    #: trace charges no such pass)
    ranks = 1

    #: ``mark(name)`` after each step, ``name`` the op of ddlsim's trace that charges the
    #: work since the last mark (``fwd.attn``, ``bwd.elementwise``, …): the op-by-op
    #: accounting of :mod:`.accounting` sets it; None (the default) marks nothing
    mark = None

    def shard(self, size: int) -> np.ndarray:
        """A buffer of ``size`` gradient elements kept for the reduce-scatter update (its
        shard of the summed gradients), made once: a framework's persistent bucket."""
        got = getattr(self, "_shard", None)
        if got is None or got.size != size:
            got = self._shard = np.empty(size, dtype=self.g.dtype)
        return got

    def _mark(self, name: str) -> None:
        if self.mark is not None:
            self.mark(name)

    # ------------------------------------------------------------------ forward
    def forward(self, idx: np.ndarray, targets: np.ndarray) -> tuple[float, list]:
        """Mean cross-entropy loss of a ``(batch, seq)`` batch of token ids, and the
        activations the backward needs."""
        s, P, m = self.shape, self.P, self._mark
        B, T, h = idx.shape[0], idx.shape[1], s.hidden
        x = (P["wte"][idx] + P["wpe"][:T]).reshape(B * T, h)
        m("embedding")
        caches = []
        for i in range(s.layers):
            ln1, c1 = layernorm(x, P[f"{i}.ln1_w"], P[f"{i}.ln1_b"])
            m("fwd.elementwise")
            q, k, v, att, y = self._attention(ln1, i, B, T)
            proj = y @ P[f"{i}.proj_w"]
            m("fwd.attn")
            proj += P[f"{i}.proj_b"]
            x1 = proj
            x1 += x
            ln2, c2 = layernorm(x1, P[f"{i}.ln2_w"], P[f"{i}.ln2_b"])
            m("fwd.elementwise")
            pre = ln2 @ P[f"{i}.fc_w"]
            m("fwd.mlp")
            pre += P[f"{i}.fc_b"]
            act, t = gelu(pre)
            m("fwd.elementwise")
            out = act @ P[f"{i}.fcproj_w"]
            m("fwd.mlp")
            out += P[f"{i}.fcproj_b"]
            out += x1
            x = out
            m("fwd.elementwise")
            caches.append((ln1, c1, q, k, v, att, y, ln2, c2, pre, act, t))
        lnf, cf = layernorm(x, P["lnf_w"], P["lnf_b"])
        m("final_norm")
        logits = lnf @ P["wte"].T
        m("logits")
        logits -= logits.max(axis=-1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=-1, keepdims=True)  # now the probabilities
        flat_t = targets.reshape(-1)
        loss = float(-np.log(logits[np.arange(B * T), flat_t]).mean())
        m("loss")
        return loss, [idx, flat_t, caches, lnf, cf, logits]

    def _attention(self, ln1: np.ndarray, i: int, B: int, T: int):
        """Layer ``i``'s QKV projection and causal attention core: q, k, v, the
        probabilities and the heads' outputs as ``(B·T, h)``."""
        s, P = self.shape, self.P
        h, a = s.hidden, s.heads
        qkv = ln1 @ P[f"{i}.qkv_w"]
        qkv += P[f"{i}.qkv_b"]
        q, k, v = (qkv.reshape(B, T, 3, a, h // a).transpose(2, 0, 3, 1, 4))
        att = softmax(q @ k.transpose(0, 1, 3, 2), self._mask[:T, :T],
                       np.float32(1.0 / math.sqrt(h // a)))
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B * T, h)
        return q, k, v, att, y

    # ----------------------------------------------------------------- backward
    def backward(self, acts: list) -> None:
        """Gradients of the mean loss into :attr:`g` (overwritten, not accumulated)."""
        s, P, G, m = self.shape, self.P, self.G, self._mark
        idx, flat_t, caches, lnf, cf, probs = acts
        B, T, h = idx.shape[0], idx.shape[1], s.hidden
        self.g[:] = 0.0
        m("bwd.grad_accumulate")
        dlogits = probs  # softmax − one-hot, / tokens: in place on the probabilities
        dlogits[np.arange(B * T), flat_t] -= 1.0
        dlogits /= B * T * self.ranks
        m("bwd.loss")
        wgrad = dlogits.T @ lnf
        m("bwd.logits")
        G["wte"] += wgrad
        m("bwd.grad_accumulate.embedding")
        dlnf = dlogits @ P["wte"]
        m("bwd.logits")
        dx = layernorm_back(dlnf, P["lnf_w"], cf, G["lnf_w"], G["lnf_b"])
        m("bwd.final_norm")
        for i in reversed(range(s.layers)):
            dx = self._block_backward(dx, i, caches[i], B, T)
        dx = dx.reshape(B, T, h)
        G["wpe"][:T] += dx.sum(axis=0)
        np.add.at(G["wte"], idx.reshape(-1), dx.reshape(B * T, h))
        m("bwd.embedding")

    def _accumulate(self, name: str, wgrad: np.ndarray, op: str) -> None:
        """``G[name] += wgrad``: the weight gradient ``op``'s GEMM made, then accumulated."""
        self._mark(op)
        self.G[name] += wgrad
        self._mark("bwd.grad_accumulate")

    def _block_backward(self, dx: np.ndarray, i: int, cache: tuple, B: int, T: int):
        """Layer ``i``'s backward from the gradient ``dx`` of its output (``(B·T, h)``) to
        that of its input; weight gradients accumulated into :attr:`G`."""
        P, G, m = self.P, self.G, self._mark
        h, a = self.shape.hidden, self.shape.heads
        ln1, c1, q, k, v, att, y, ln2, c2, pre, act, t = cache
        self._accumulate(f"{i}.fcproj_w", act.T @ dx, "bwd.mlp")
        G[f"{i}.fcproj_b"] += dx.sum(axis=0)
        m("bwd.elementwise")
        dact = dx @ P[f"{i}.fcproj_w"].T
        m("bwd.mlp")
        dpre = gelu_back(dact, pre, t)
        m("bwd.elementwise")
        self._accumulate(f"{i}.fc_w", ln2.T @ dpre, "bwd.mlp")
        G[f"{i}.fc_b"] += dpre.sum(axis=0)
        m("bwd.elementwise")
        dln2 = dpre @ P[f"{i}.fc_w"].T
        m("bwd.mlp")
        dx = dx + layernorm_back(dln2, P[f"{i}.ln2_w"], c2, G[f"{i}.ln2_w"], G[f"{i}.ln2_b"])
        m("bwd.elementwise")
        self._accumulate(f"{i}.proj_w", y.T @ dx, "bwd.attn")
        G[f"{i}.proj_b"] += dx.sum(axis=0)
        m("bwd.elementwise")
        dy = (dx @ P[f"{i}.proj_w"].T).reshape(B, T, a, h // a).transpose(0, 2, 1, 3)
        datt = dy @ v.transpose(0, 1, 3, 2)
        dv = att.transpose(0, 1, 3, 2) @ dy
        softmax_back(datt, att, np.float32(1.0 / math.sqrt(h // a)))
        dq, dk = datt @ k, datt.transpose(0, 1, 3, 2) @ q
        dqkv = heads_to_rows((dq, dk, dv), B, T, h)
        self._accumulate(f"{i}.qkv_w", ln1.T @ dqkv, "bwd.attn")
        G[f"{i}.qkv_b"] += dqkv.sum(axis=0)
        dln1 = dqkv @ P[f"{i}.qkv_w"].T
        m("bwd.attn")
        dx = dx + layernorm_back(dln1, P[f"{i}.ln1_w"], c1, G[f"{i}.ln1_w"], G[f"{i}.ln1_b"])
        m("bwd.elementwise")
        return dx


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) on a slice of a flat buffer, in place, a block of
    :attr:`BLOCK` elements at a time: each block's parameters, gradients and moments are read
    from memory once and written once while numpy's temporaries stay in cache, so memory
    sees 28 bytes per fp32 parameter (read p, g, m, v; write p, m, v), the traffic of a fused
    multi-tensor Adam (docs/compute.md, "fused multi-tensor Adam 28 B/parameter")."""

    #: elements per block: 128 KiB per array, the four arrays and two temporaries within a
    #: 2 MiB L2 (on this project's 2-core machine 32768 ran Adam fastest of 4096-262144)
    BLOCK = 32768

    def __init__(self, n: int, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.m = np.zeros(n, dtype=np.float32)
        self.v = np.zeros(n, dtype=np.float32)
        self.lr, self.b1, self.b2, self.eps, self.t = lr, betas[0], betas[1], eps, 0
        self._tmp = np.empty((2, self.BLOCK), dtype=np.float32)

    #: ``mark("optimizer")`` at the end of each step, when set (:attr:`GPT2.mark`)
    mark = None

    def step(self, p: np.ndarray, g: np.ndarray, lo: int = 0, hi: int | None = None,
             g_lo: int | None = None) -> None:
        """Update ``p[lo:hi]`` (the slice this rank owns) from its gradient, ``g[lo:hi]``, or
        ``g[g_lo:g_lo + hi - lo]`` when ``g_lo`` is given (a shard of its own)."""
        if self.mark is not None:
            self.mark("exchange")
        self.t += 1
        hi = p.size if hi is None else hi
        shift = 0 if g_lo is None else g_lo - lo
        step = self.lr / (1.0 - self.b1 ** self.t)
        root_c2 = np.sqrt(1.0 - self.b2 ** self.t)
        for a in range(lo, hi, self.BLOCK):
            b = min(a + self.BLOCK, hi)
            m, v, w, d = self.m[a:b], self.v[a:b], p[a:b], g[a + shift:b + shift]
            t, u = self._tmp[0, :b - a], self._tmp[1, :b - a]
            m -= d                        # m = b1·m + (1 − b1)·d = b1·(m − d) + d
            m *= self.b1
            m += d
            np.multiply(d, d, out=t)      # v = b2·(v − d²) + d²
            v -= t
            v *= self.b2
            v += t
            np.sqrt(v, out=u)             # step·m̂/(√v̂ + ε) = step·c·m/(√v + ε·c),
            u += self.eps * root_c2       # c = √(1 − b2^t)
            np.divide(m, u, out=u)
            u *= step * root_c2
            w -= u
        if self.mark is not None:
            self.mark("optimizer")
