"""Layer partitioners: how a decoder layer's GEMMs, attention and elementwise work are split
over a tensor-parallel grid (and the sequence over the ``cp`` axis).

A partitioner maps each GEMM ``(M, N, K)`` of a layer (``M`` tokens, ``N`` outputs, ``K``
inputs) to per-rank compute and the collectives on the grid's axes, and says what the scheme
implies for the parameters and activations one rank holds. The config names a scheme and its
grid (``parallel.tensor_parallel: {mode: 2.5d, q: 4, d: 4}``); ``tensor_model_parallel_size``
alone is the 1-D (Megatron) scheme. Registered schemes, keyed by the ``mode`` users type:

* ``1d``  :class:`.megatron_1d.Megatron1D` (Shoeybi et al. 2019), today's builder exactly;
* ``2d``  :class:`.summa_2d.Summa2D` (Optimus, Xu et al. 2021), a ``q×q`` grid;
* ``2.5d`` :class:`.tesseract_2_5d.Tesseract25D` (Wang et al. 2021), ``q×q×d``;
* ``3d``  :class:`.agarwal_3d.Agarwal3D` (Agarwal et al. 1995; Bian et al. 2021), ``q×q×q``.

Context parallelism (:mod:`.context`) is orthogonal: any scheme runs its attention core as a
ring over ``cp`` (or after an all-gather of K/V). docs/tensor_parallel.md derives every volume.
"""

from __future__ import annotations

from typing import Any

from ....registered import TENSOR_PARALLEL_SCHEMES, tensor_parallel_modes
from .base import LayerPartitioner
from .oplist import OpList

__all__ = ["LayerPartitioner", "OpList", "partitioners", "register_partitioner",
           "make_partitioner"]

#: the registry the config validates ``parallel.tensor_parallel.mode`` against
_REGISTRY: dict[str, type[LayerPartitioner]] = TENSOR_PARALLEL_SCHEMES


def register_partitioner(mode: str):
    """Class decorator: register a :class:`LayerPartitioner` under the ``mode`` users type."""
    def deco(cls: type[LayerPartitioner]) -> type[LayerPartitioner]:
        cls.mode = mode
        _REGISTRY[mode] = cls
        return cls
    return deco


def partitioners() -> dict[str, type[LayerPartitioner]]:
    """The registered schemes, ``mode`` → class (importing the built-in ones,
    :data:`ddlsim.registered.BUILTIN_TENSOR_PARALLEL`)."""
    return tensor_parallel_modes()


def make_partitioner(plan: Any) -> LayerPartitioner:
    """The partitioner of a resolved decoder plan.

    Parameters
    ----------
    plan : DecoderPlan
        The run's resolved plan (:func:`..plan.resolve_plan`); its ``tp_mode`` names the
        registered scheme.

    Returns
    -------
    LayerPartitioner
        The scheme's partitioner, reading the plan and nothing else.
    """
    return partitioners()[plan.tp_mode](plan)
