"""Decoder-only transformers as trained today: parameters, FLOPs, bytes, activation memory.

One frozen :class:`DecoderShape` covers GPT-2/GPT-3 (LayerNorm, learned positions, GeLU,
biases, tied embeddings, multi-head attention), Llama/Mistral (RMSNorm, rotary positions,
SwiGLU, no biases, untied, grouped-query attention), Qwen2 (QKV bias only) and
Mixture-of-Experts decoders (Mixtral, Qwen2-MoE, GPT-3 MoE). With a GPT-style shape every
count equals :class:`~ddlsim.workloads.models.gpt.GPTShape`'s exactly.

Notation: ``b`` micro-batch, ``s`` sequence, ``h`` hidden, ``a`` query heads, ``g`` key/value
heads (``g = a``: MHA; ``1 < g < a``: GQA; ``g = 1``: MQA), ``d`` head size (default
``h/a``), ``f`` FFN size, ``V`` vocabulary, ``L`` layers, ``t`` tensor-parallel size; MoE:
``E`` experts, ``k`` top-k, ``f_e`` expert FFN size, ``n_s`` shared experts of size ``f_s``.

Parameters of one layer
    q ``h·ad`` (+``ad`` bias), k and v ``2·h·gd`` (+``2gd``), output ``ad·h`` (+``h``);
    MLP ``m·h·f`` with ``m = 3`` matrices when gated (SwiGLU/GeGLU: gate, up, down;
    Shazeer 2020) and ``m = 2`` otherwise, biases ``(m−1)·f + h``; two norms of ``h``
    (RMSNorm, weight only) or ``2h`` (LayerNorm, weight and bias). An MoE layer replaces
    the MLP by ``E`` expert MLPs of size ``f_e``, a router ``h·E`` (no bias), ``n_s`` shared
    experts of size ``f_s`` and, in Qwen2-MoE, a shared-expert gate ``h``.
    Embeddings ``V·h`` + learned positions ``s_max·h`` (rotary: none; Su et al. 2021) +
    an output head ``V·h`` when untied; final norm ``h`` or ``2h``.
    Llama 2 (Touvron et al. 2023): 7B = 6,738,415,616, 70B = 68,976,648,192.
Forward FLOPs of one layer (2 FLOPs per multiply-add; Narayanan et al. 2021 §5.1)
    q ``2bs·h·ad``; k, v ``2bs·h·2gd`` (GQA shrinks only this term; Ainslie et al. 2023);
    attention core ``4bs²·ad`` (QKᵀ and scores·V; every query head attends, so GQA does not
    change it); output ``2bs·ad·h``; MLP ``2m·bs·h·f``; MoE: router ``2bs·h·E``, routed
    experts ``k·2m·bs·h·f_e`` (each token meets ``k`` experts; Jiang et al. 2024),
    shared experts ``n_s·2m·bs·h·f_s``. Logits ``2bs·h·V``. Training = 3 × forward.
Parameter counts: :mod:`.decoder_params`; memory traffic and activation bytes:
:mod:`.decoder_traffic`.

References: Touvron et al. 2023 ("Llama 2", arXiv:2307.09288); Ainslie et al. 2023 ("GQA",
arXiv:2305.13245); Shazeer 2020 ("GLU Variants Improve Transformer", arXiv:2002.05202);
Jiang et al. 2024 ("Mixtral of Experts", arXiv:2401.04088); Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...errors import ConfigError
from ...simulator.kernels.window import window_keys
from .decoder_params import DecoderParams
from .decoder_traffic import DecoderTraffic
from .mla import MLA

__all__ = ["DecoderShape", "MLA"]

Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "rotary"]


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"decoder field {name} = {value!r} must be a positive integer")


@dataclass(frozen=True, slots=True)
class DecoderShape(DecoderParams, DecoderTraffic):
    """Closed-form counts for one decoder-only transformer (dense or Mixture-of-Experts).

    Parameters
    ----------
    layers, hidden, heads : int
        ``L``, ``h`` and the number of query heads ``a``.
    ffn : int
        Dense MLP size ``f`` (``intermediate_size``); the expert size defaults to it.
    vocab : int
        Vocabulary ``V``.
    max_positions : int or None
        ``s_max``; needed (and counted as ``s_max·h`` parameters) for learned positions only.
    kv_heads : int or None
        Key/value heads ``g`` (``num_key_value_heads``); default ``a`` (multi-head).
    head_dim : int or None
        ``d``; default ``h / a``.
    gated_mlp : bool
        Three MLP matrices (SwiGLU, GeGLU) instead of two.
    activation : str
        The MLP non-linearity's name (HuggingFace ACT2FN: ``silu``, ``gelu_new``, …). ``relu2``
        (squared ReLU, Nemotron's ``ReLUSquaredActivation``; Megatron's ``squared_relu``) has
        kernels of its own (:func:`ddlsim.simulator.kernels.elementwise.activation_passes`);
        the others are informative (a gated MLP's kernels are SwiGLU's, an ungated one's
        GeLU's).
    norm : {"layernorm", "rmsnorm"}
    positions : {"learned", "rotary"}
    rotary_share : float
        The share of each head's dimensions the rotary embedding rotates (HuggingFace
        ``partial_rotary_factor``, NeMo's ``rotary_percentage``: Nemotron-4 0.5); 1: all.
    tied_embeddings : bool
        Output head shares the input embedding (no ``V·h`` of its own).
    qkv_bias, out_bias, mlp_bias : bool
        Biases of the q/k/v projections, of the attention output, of the MLP GEMMs.
    dropout : bool
        Dropout after attention, on the scores and after the MLP (GPT) or none (Llama).
    experts, top_k : int
        ``E`` routed experts per MoE layer (0: dense model) and the experts per token ``k``.
    expert_ffn : int or None
        ``f_e``; default ``f``.
    moe_layer_freq : int
        Every ``moe_layer_freq``-th layer is an MoE layer: layer ``i`` (from 0) when
        ``(i + 1) % moe_layer_freq == 0`` (HuggingFace ``decoder_sparse_step``); 1: every layer.
    shared_experts : int
        ``n_s`` always-active experts per MoE layer, each of ``shared_expert_ffn``
        (default ``f_e``); ``shared_expert_gate`` adds Qwen2-MoE's ``h×1`` sigmoid gate.
    capacity_factor : float or None
        Expert capacity factor (GShard/Switch); None: dropless.
    first_dense_layers : int
        The first layers keep the dense MLP (DeepSeek-V3's ``first_k_dense_replace``).
    router_bias : bool
        The router has a bias of ``E`` (GPT-OSS; DeepSeek-V3's ``e_score_correction_bias``).
    mla : MLA or None
        Multi-head Latent Attention's sizes (:mod:`.mla`); None: Q, K, V projections.
    qk_norm : bool
        RMSNorm of each head's query and key (Qwen3: ``q_norm``, ``k_norm`` of ``d`` each).
    attention_sinks : bool
        One learned softmax sink logit per query head (GPT-OSS): ``a`` parameters per layer.
    glu_clamp : float or None
        The gated MLP's inputs clamped (GPT-OSS's ``swiglu_limit``: the gate at most ``c``,
        the linear half within ``±c``); None: not clamped. It adds the clamps' element-wise
        kernels (:mod:`ddlsim.workloads.decoder.moe`), not parameters or FLOPs.
    sliding_window : int or None
        Keys a query sees in a sliding-window layer (:mod:`ddlsim.simulator.kernels.window`).
    window_layers : int
        How many of the ``L`` layers use the window (GPT-OSS: every other one; Mistral: all).
        The FLOPs of a layer's attention core are the stack's mean over its layer types.
    """

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = False
    activation: str = "gelu"
    norm: Norm = "layernorm"
    positions: Positions = "learned"
    rotary_share: float = 1.0
    tied_embeddings: bool = True
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    dropout: bool = True
    experts: int = 0
    top_k: int = 0
    expert_ffn: int | None = None
    moe_layer_freq: int = 1
    shared_experts: int = 0
    shared_expert_ffn: int | None = None
    shared_expert_gate: bool = False
    capacity_factor: float | None = None
    first_dense_layers: int = 0
    router_bias: bool = False
    mla: MLA | None = None
    qk_norm: bool = False
    attention_sinks: bool = False
    glu_clamp: float | None = None
    sliding_window: int | None = None
    window_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "ffn", "vocab", "moe_layer_freq"):
            _positive(name, getattr(self, name))
        for name in ("max_positions", "kv_heads", "head_dim", "expert_ffn", "shared_expert_ffn"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"decoder field norm = {self.norm!r}; allowed: layernorm, rmsnorm")
        if self.positions not in ("learned", "rotary"):
            raise ConfigError(f"decoder field positions = {self.positions!r}; allowed: learned, rotary")
        if not 0 < self.rotary_share <= 1 or (self.rotary_share != 1
                                                and self.positions != "rotary"):
            raise ConfigError(f"decoder field rotary_share = {self.rotary_share!r}; allowed: "
                              "above 0 and at most 1, and below 1 only with rotary positions")
        if self.squared_relu and (self.gated_mlp or self.experts):
            raise ConfigError("decoder field activation = 'relu2' (squared ReLU) is modelled for "
                              "an ungated dense MLP (Nemotron's); allowed with it: gated_mlp "
                              "false and no experts")
        if self.positions == "learned" and self.max_positions is None:
            raise ConfigError("decoder field max_positions is needed with learned positions "
                              "(they hold max_positions × hidden parameters)")
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"hidden = {self.hidden} is not a multiple of heads = {self.heads}; "
                              "give head_dim")
        if self.heads % self.g:
            raise ConfigError(f"heads = {self.heads} is not a multiple of kv_heads = {self.g}: "
                              "each key/value head serves a whole group of query heads")
        if self.experts < 0 or self.shared_experts < 0:
            raise ConfigError(f"experts = {self.experts}, shared_experts = {self.shared_experts}: "
                              "must be >= 0")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ConfigError(f"top_k = {self.top_k} with {self.experts} experts; allowed: 1 to "
                              f"{self.experts}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(f"capacity_factor = {self.capacity_factor!r} must be > 0, or null "
                              "for dropless routing")
        self._check_variants()

    def _check_variants(self) -> None:
        """The attention variants' and dense-prefix fields against each other."""
        if not 0 <= self.first_dense_layers < self.layers:
            raise ConfigError(f"first_dense_layers = {self.first_dense_layers!r} must be between "
                              f"0 and layers - 1 = {self.layers - 1}")
        if self.sliding_window is not None:
            _positive("sliding_window", self.sliding_window)
        if not 0 <= self.window_layers <= self.layers or (
                self.window_layers and self.sliding_window is None):
            raise ConfigError(f"window_layers = {self.window_layers!r} must be between 0 and "
                              f"layers = {self.layers}, and needs sliding_window")
        if self.mla is not None and (self.kv_heads not in (None, self.heads) or self.qk_norm):
            raise ConfigError("Multi-head Latent Attention (mla) has one key and value per query "
                              f"head: kv_heads = {self.kv_heads!r} and qk_norm = {self.qk_norm} "
                              "are not allowed with it")

    # ------------------------------------------------------------------ derived sizes
    @property
    def g(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.heads

    @property
    def d(self) -> float:
        """Head size the attention core sees; with MLA the mean of the query/key and value
        head sizes, ``(d_n + d_r + d_v)/2`` (QKᵀ is linear in the first, P·V in the second,
        so the core's FLOPs and bytes are those of this mean)."""
        if self.mla is not None:
            m = self.mla
            half = (m.qk_head_dim + m.v_head_dim) / 2
            return int(half) if half == int(half) else half
        return self.head_dim or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """``a·d``: width of Q and of the attention output (MLA: ``a·(d_n + d_r)``)."""
        if self.mla is not None:
            return self.heads * self.mla.qk_head_dim
        return self.heads * self.d

    @property
    def kv_width(self) -> int:
        """``g·d``: width of K and of V (MLA: ``a·d_v``, so that Q, K, V and the output
        projection's input sum as ``2·(q_width + kv_width)``)."""
        if self.mla is not None:
            return self.heads * self.mla.v_head_dim
        return self.g * self.d

    @property
    def rope_width(self) -> int:
        """Width of the rotary embedding's pass per token: Q and K (``q_width + kv_width``);
        MLA rotates only the decoupled parts, ``a·d_r`` of the queries and the shared ``d_r``
        key."""
        if self.mla is not None:
            return (self.heads + 1) * self.mla.qk_rope_head_dim
        return self.q_width + self.kv_width

    @property
    def window_share(self) -> float:
        """Fraction of the layers that use the sliding window."""
        return self.window_layers / self.layers

    def core_keys(self, s: int) -> float:
        """Keys per query in one layer's attention-core FLOPs, the mean over the stack's layer
        types: ``s`` (full) or ``min(w, s)`` (window) (:func:`.window_keys`)."""
        w = self.window_share
        return (1 - w) * window_keys(s, None) + w * window_keys(s, self.sliding_window)

    @property
    def squared_relu(self) -> bool:
        """The MLP's non-linearity is squared ReLU (``relu2``), ``relu(x)²``."""
        return self.activation == "relu2"

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def f_e(self) -> int:
        return self.expert_ffn or self.ffn

    @property
    def f_s(self) -> int:
        return self.shared_expert_ffn or self.f_e

    @property
    def mlp_matrices(self) -> int:
        """3 for a gated MLP (gate, up, down), else 2."""
        return 3 if self.gated_mlp else 2

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) is a Mixture-of-Experts layer: past the first
        ``first_dense_layers`` and every ``moe_layer_freq``-th."""
        return (self.is_moe and i >= self.first_dense_layers
                and (i + 1) % self.moe_layer_freq == 0)

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers."""
        if not self.is_moe:
            return 0
        f, k = self.moe_layer_freq, self.first_dense_layers
        return self.layers // f - k // f

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def _uniform(self, moe: bool | None) -> bool:
        if moe is not None:
            if moe and not self.is_moe:
                raise ValueError("moe=True asks for an MoE layer of a dense model (experts = 0)")
            return moe
        if self.moe_layers not in (0, self.layers):
            raise ValueError(f"{self.moe_layers} of {self.layers} layers are MoE layers: say "
                             "moe=True or moe=False")
        return self.moe_layers == self.layers

    # ------------------------------------------------------------------ FLOPs (forward)
    def layer_gemm_flops(self, b: int, s: int, *, moe: bool | None = None) -> dict[str, float]:
        """Forward FLOPs of one layer's GEMMs, unsharded, by part.

        Keys: ``q``, ``kv``, ``attn_core``, ``proj`` and either ``mlp`` (dense layer) or
        ``router``, ``experts``, ``shared_experts`` (MoE layer; ``experts`` counts the
        ``top_k`` experts each token meets, without capacity padding). ``moe`` picks the kind
        of layer; by default the kind every layer has. ``attn_core`` is ``4·b·s·n_k·a·d`` with
        ``n_k`` keys per query (:meth:`core_keys`: ``s``, or the window's band); with MLA
        ``q``, ``kv`` and ``proj`` are its projections' (:meth:`MLA.forward_flops`).
        """
        h, qw, kvw, t = self.hidden, self.q_width, self.kv_width, float(b * s)
        core = 4.0 * b * s * self.core_keys(s) * (self.heads * self.d)
        if self.mla is not None:
            out = {**self.mla.forward_flops(t, h, self.heads), "attn_core": core}
        else:
            out = {"q": 2 * t * h * qw, "kv": 2 * t * h * 2 * kvw, "attn_core": core,
                   "proj": 2 * t * qw * h}
        m = self.mlp_matrices
        if not self._uniform(moe):
            out["mlp"] = 2 * m * t * h * self.ffn
            return out
        out["router"] = 2 * t * h * self.experts
        out["experts"] = self.top_k * 2 * m * t * h * self.f_e
        out["shared_experts"] = self.shared_experts * 2 * m * t * h * self.f_s
        return out

    def layer_forward_flops(self, b: int, s: int, *, moe: bool | None = None) -> float:
        return sum(self.layer_gemm_flops(b, s, moe=moe).values())

    def stack_forward_flops(self, b: int, s: int) -> float:
        """Forward FLOPs of all ``L`` layers."""
        dense = self.dense_layers * self.layer_forward_flops(b, s, moe=False) if self.dense_layers else 0.0
        sparse = self.moe_layers * self.layer_forward_flops(b, s, moe=True) if self.moe_layers else 0.0
        return dense + sparse

    def logits_forward_flops(self, b: int, s: int) -> float:
        return 2.0 * b * s * self.hidden * self.vocab

    def model_flops(self, batch: int, s: int) -> float:
        """Training FLOPs of one iteration without recomputation: 3 × forward."""
        return 3.0 * batch * (self.stack_forward_flops(1, s) + self.logits_forward_flops(1, s))

    def expert_capacity(self, tokens: int) -> float:
        """Token slots per expert and MoE layer for ``tokens`` tokens: ``c·k·tokens/E`` with a
        capacity factor ``c`` (GShard, Switch), else the balanced load ``k·tokens/E``."""
        load = self.top_k * tokens / self.experts
        return load * self.capacity_factor if self.capacity_factor else load
