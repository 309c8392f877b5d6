"""Megatron-Core's pipeline layout string (``parallel.pipeline_model_parallel_layout``).

The string lists what each virtual pipeline stage holds, in stage order: ``E`` the input
embedding, ``t`` a transformer (decoder) layer, ``m`` a multi-token-prediction layer, ``L`` the
loss (with the output head), ``|`` the boundary between two virtual stages, ``(…)*n`` and
``x*n`` repetition, ``,`` cosmetic. Virtual stage ``k`` runs on pipeline rank ``k mod PP`` as
its chunk ``k // PP``. DeepSeek-V3's Megatron-Bridge recipe on PP 8 × VPP 4 runs
``"Et|(tt|)*30mL"``: 32 virtual stages, the first the embedding and one layer, thirty of two
layers, the last the MTP layer and the loss.

Parsed and checked as Megatron-Core does (NVIDIA/Megatron-LM, added in 77732c3628, 2025-06-13;
read at d98e8a64: megatron/core/transformer/pipeline_parallel_layer_layout.py
``PipelineParallelLayerLayout.parse_str_to_list``, ``__init__``, ``validate_layer_layout``, and
transformer_config.py lines 2242-2291): the virtual stages a multiple of PP (their quotient the
virtual pipeline size), ``E`` first and once, ``L`` last and once, as many ``t`` as
``model.num_hidden_layers``, as many ``m`` as ``model.mtp_num_layers`` and none before a ``t``,
MTP layers only in a rank's last chunk, all in one chunk, never on the first rank; the layout
excludes ``account_for_*_in_pipeline_split`` and ``num_layers_in_first/last_pipeline_stage``.
Megatron-Core takes the virtual pipeline size from the layout when none is given; ddlsim asks
for it to be given (its schedule field depends on it) and checks that the two agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["PipelineLayout", "parse_layout", "KINDS"]

#: the layout's letters (Megatron-Core parse_str_to_list ``char2layer_type``)
KINDS = {"E": "embedding", "t": "transformer layer", "m": "multi-token-prediction layer",
         "L": "loss"}
#: ``(…)*n`` then ``x*n``, unrolled in that order (Megatron-Core parse_str_to_list ``patterns``)
_REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")


@dataclass(frozen=True)
class PipelineLayout:
    """A checked layout: ``chunks[stage][chunk]`` is that chunk's letters (``"Et"``, ``"mL"``)."""

    text: str
    chunks: tuple[tuple[str, ...], ...]

    def count(self, letter: str) -> tuple[tuple[int, ...], ...]:
        """How many of ``letter`` each chunk holds: ``out[stage][chunk]``."""
        return tuple(tuple(c.count(letter) for c in row) for row in self.chunks)

    @property
    def mtp_stage(self) -> int | None:
        """The pipeline rank whose last chunk holds the MTP layers; None without any."""
        return next((s for s, row in enumerate(self.chunks) if "m" in row[-1]), None)


def _unroll(text: str) -> str:
    out = text.replace(",", "")
    for pattern in _REPEATS:
        out = re.sub(pattern, lambda g: g.group(1) * int(g.group(2)), out)
    return out


@lru_cache(maxsize=64)
def parse_layout(text: str, pp: int, vpp: int, layers: int,
                 mtp_layers: int) -> PipelineLayout:
    """The layout string checked against the plan and the model (module docstring).

    Raises ``ValueError`` quoting the string, the position and what is allowed."""
    field = f"parallel.pipeline_model_parallel_layout = {text!r}"
    flat = _unroll(text)
    for pos, ch in enumerate(flat):
        if ch not in KINDS and ch != "|":
            where = (f"character {text.index(ch) + 1} of the string" if ch in text
                     else f"character {pos + 1} of its unrolled form {flat!r}")
            raise ValueError(f"{field}: {ch!r} at {where} is not a layout letter; allowed: "
                             + ", ".join(f"{k} ({v})" for k, v in KINDS.items())
                             + ", '|' between virtual stages, (…)*n or x*n to repeat")
    stages = flat.split("|")
    if len(stages) % pp:
        raise ValueError(f"{field} lists {len(stages)} virtual stages, not a multiple of "
                         f"pipeline_model_parallel_size = {pp} (Megatron-Core asserts it)")
    if len(stages) // pp != vpp:
        raise ValueError(f"{field} lists {len(stages)} virtual stages = {pp} pipeline stages "
                         f"× {len(stages) // pp}; the plan has virtual_pipeline_model_parallel_"
                         f"size = {vpp}: set it to {len(stages) // pp} (schedule 'interleaved' "
                         "when above 1), as Megatron-Core takes it from the layout")
    _check_order(field, flat, layers, mtp_layers)
    chunks = tuple(tuple(stages[c * pp + s] for c in range(vpp)) for s in range(pp))
    _check_mtp(field, chunks, mtp_layers)
    return PipelineLayout(text, chunks)


def _check_order(field: str, flat: str, layers: int, mtp_layers: int) -> None:
    """E first and once, L last and once, the counts of t and m, no t after an m."""
    body = flat.replace("|", "")
    if not body or body[0] != "E" or body.count("E") != 1:
        raise ValueError(f"{field}: the embedding 'E' must come first and once (Megatron-Core "
                         "validate_layer_layout)")
    if body[-1] != "L" or body.count("L") != 1:
        raise ValueError(f"{field}: the loss 'L' must come last and once (Megatron-Core "
                         "validate_layer_layout)")
    if body.count("t") != layers:
        raise ValueError(f"{field} holds {body.count('t')} transformer layers 't'; "
                         f"model.num_hidden_layers = {layers}")
    if body.count("m") != mtp_layers:
        raise ValueError(f"{field} holds {body.count('m')} multi-token-prediction layers 'm'; "
                         f"model.mtp_num_layers = {mtp_layers}")
    if "m" in body and "t" in body[body.index("m"):]:
        pos = flat.index("t", flat.index("m")) + 1
        raise ValueError(f"{field}: a transformer layer 't' at character {pos} of the "
                         "unrolled layout comes after an MTP layer 'm'; decoder layers must "
                         "come before the MTP layers")


def _check_mtp(field: str, chunks: tuple, mtp_layers: int) -> None:
    """MTP layers only in a rank's last chunk, all in one, not on the first rank, and (as
    ddlsim models them) on the last rank."""
    for s, row in enumerate(chunks):
        for c, chunk in enumerate(row[:-1]):
            if "m" in chunk:
                raise ValueError(f"{field}: pipeline stage {s}'s chunk {c} holds an MTP layer; "
                                 "Megatron-Core places MTP layers only in a stage's last chunk")
        if "m" in row[-1] and row[-1].count("m") != mtp_layers:
            raise ValueError(f"{field}: all {mtp_layers} MTP layers must be in one virtual "
                             "stage (Megatron-Core validate_layer_layout)")
    pp = len(chunks)
    for s, row in enumerate(chunks):
        if "m" in row[-1] and s != pp - 1:
            raise ValueError(f"{field}: the MTP layers on pipeline stage {s} (Megatron-Core's "
                             "'standalone' MTP stage) are not modelled; ddlsim models them on "
                             f"the last stage ({pp - 1}), with the loss")
