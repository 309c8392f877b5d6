"""Multi-head Latent Attention (MLA): DeepSeek-V2/V3's attention, as its projections' shapes.

MLA (DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, §2.1.2-2.1.3, eqs. 9-19; used unchanged
by DeepSeek-V3, arXiv:2412.19437, §2.1.1) replaces the Q, K and V projections of ``a`` heads by
low-rank ones through two small latent vectors per token, and splits each head's query and key
into a part without positions (``d_n``, ``qk_nope_head_dim``) and a decoupled rotary part
(``d_r``, ``qk_rope_head_dim``) whose key is shared by all heads. With the Hugging Face names of
``modeling_deepseek_v3.py`` (``DeepseekV3Attention``) and ``h`` hidden, ``r_q`` =
``q_lora_rank``, ``r_kv`` = ``kv_lora_rank``, ``d_v`` = ``v_head_dim``:

==================  =======================  ================================================
module              weight                   what it computes
==================  =======================  ================================================
q_a_proj            ``h × r_q``              the query latent ``c_q`` (eq. 12), then RMSNorm
q_b_proj            ``r_q × a(d_n + d_r)``   every head's query, both parts (eqs. 13-14)
kv_a_proj_with_mqa  ``h × (r_kv + d_r)``     the key/value latent ``c_kv`` (eq. 9), RMSNorm,
                                             and the shared rotary key ``k_r`` (eq. 15)
kv_b_proj           ``r_kv × a(d_n + d_v)``  every head's key (no-position part) and value
                                             (eqs. 10-11)
o_proj              ``a·d_v × h``            the output projection (eq. 19)
==================  =======================  ================================================

Without ``q_lora_rank`` (DeepSeek-V2-Lite) the query is one ``h × a(d_n + d_r)`` projection.
The attention core then multiplies queries and keys of ``d_n + d_r`` per head and
probabilities and values of ``d_v``. In training every head's key and value are materialised
(the latent absorption of the paper's §2.1.2 is an inference trick for the KV cache), so the
core is ordinary multi-head attention with unequal head dimensions.

Under Megatron-Core's tensor parallelism (``MLASelfAttention``) the two down projections are
replicated on every tensor-parallel rank and the up and output projections are split by heads.
With sequence parallelism the replicated down projections read the rank's own ``s/t`` tokens
and the up projections all-gather the latents, not the hidden states
(:mod:`~ddlsim.workloads.decoder.partition.mla_1d`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError

__all__ = ["MLA"]


@dataclass(frozen=True, slots=True)
class MLA:
    """The sizes of a Multi-head Latent Attention block (module docstring).

    Parameters
    ----------
    kv_lora_rank : int
        ``r_kv``, the key/value latent's width.
    qk_nope_head_dim, qk_rope_head_dim : int
        ``d_n`` and ``d_r``: each head's query/key dimensions without and with rotary positions.
    v_head_dim : int
        ``d_v``: each head's value (and attention output) dimension.
    q_lora_rank : int or None
        ``r_q``, the query latent's width; None: a direct query projection.
    bias : bool
        Biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` (``attention_bias``).
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    bias: bool = False

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "q_lora_rank"):
            v = getattr(self, name)
            if v is None and name == "q_lora_rank":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"decoder field {name} = {v!r} must be a positive integer")

    @property
    def qk_head_dim(self) -> int:
        """``d_n + d_r``: the query/key dimension of each head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def projections(self, h: int, a: int) -> dict[str, tuple[int, int, bool]]:
        """Each projection's ``(in, out, split over TP)`` on ``h`` hidden and ``a`` heads, in
        forward order (the module docstring's table)."""
        out = {}
        if self.q_lora_rank:
            out["q_down"] = (h, self.q_lora_rank, False)
            out["q_up"] = (self.q_lora_rank, a * self.qk_head_dim, True)
        else:
            out["q_up"] = (h, a * self.qk_head_dim, True)
        out["kv_down"] = (h, self.kv_lora_rank + self.qk_rope_head_dim, False)
        out["kv_up"] = (self.kv_lora_rank, a * (self.qk_nope_head_dim + self.v_head_dim), True)
        out["proj"] = (a * self.v_head_dim, h, True)
        return out

    def params(self, h: int, a: int) -> int:
        """Parameters of the attention block: the five projections' weights, the biases of
        ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` when ``bias``, and the two latent
        RMSNorms (``r_q`` and ``r_kv``). DeepSeek-V3: 187,107,328 per layer."""
        n = sum(i * o for i, o, _ in self.projections(h, a).values())
        norms = (self.q_lora_rank or 0) + self.kv_lora_rank
        bias = 0
        if self.bias:
            bias = (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim + h
        return n + norms + bias

    def gemms(self, tokens: float, h: int, a: int, t: int,
              sp: bool = False) -> dict[str, tuple[float, float, float]]:
        """``(M, N, K)`` of each projection's forward GEMM on one of ``t`` tensor-parallel
        ranks for ``tokens`` rows: the down projections whole (replicated) on the rank's own
        rows, ``tokens / t`` under sequence parallelism (``sp``: they read the
        sequence-parallel shard, Megatron-Core's ``parallel_mode='duplicated'``), the others
        split by heads on every row."""
        own = tokens / t if sp else tokens
        return {name: (tokens, o / t, i) if split and name != "proj"
                else (tokens, o, i / t) if name == "proj" else (own, o, i)
                for name, (i, o, split) in self.projections(h, a).items()}

    def down_params(self, h: int) -> int:
        """Weights of the two down projections (``q_a_proj``, ``kv_a_proj_with_mqa``), which
        every tensor-parallel rank holds whole."""
        return sum(i * o for name, (i, o, split) in self.projections(h, 1).items()
                   if not split)

    def gathered_widths(self, h: int) -> tuple[tuple[str, int], ...]:
        """What the up projections all-gather over tensor parallelism under sequence
        parallelism, per token: the query latent (``r_q``; the hidden ``h`` that a direct
        query projection reads without ``q_lora_rank``), the key/value latent (``r_kv``) and
        the shared rotary key (``d_r``), each gathered apart."""
        return (("q", self.q_lora_rank or h), ("kv", self.kv_lora_rank),
                ("k_pos", self.qk_rope_head_dim))

    def forward_flops(self, tokens: float, h: int, a: int) -> dict[str, float]:
        """Forward FLOPs of the projections for ``tokens`` tokens, unsharded: ``q`` (query
        down and up), ``kv`` (key/value down and up) and ``proj``; 2 FLOPs per multiply-add."""
        p = self.projections(h, a)
        mm = {name: 2.0 * tokens * i * o for name, (i, o, _) in p.items()}
        return {"q": mm.get("q_down", 0.0) + mm["q_up"], "kv": mm["kv_down"] + mm["kv_up"],
                "proj": mm["proj"]}

    def latent_width(self) -> int:
        """``r_q + r_kv``: the normalised latents the up projections read (kept for their
        backward)."""
        return (self.q_lora_rank or 0) + self.kv_lora_rank
