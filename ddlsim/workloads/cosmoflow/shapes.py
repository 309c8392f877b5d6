"""CosmoFlow's layers: shapes, parameters, FLOPs, halo faces and activation memory per rank.

Conv layer ``i`` (``'same'`` padding, stride 1) keeps its input's spatial size
``S_i = S_0 / pool^i`` per axis, maps ``C_in(i)`` channels (``C_in(0)`` = the input's, else
``conv_size·2^(i-1)``) to ``C_out(i) = conv_size·2^i`` and has ``C_in·k³·C_out + C_out``
parameters. A MaxPool3D(pool) follows it. The dense layers map ``prod(S_n)·C_out(n-1)``
flattened features through ``fc_sizes`` to ``target_size``, each with ``n_in·n_out + n_out``
parameters. Forward FLOPs: ``2·b·voxels·C_in·k³·C_out`` per conv (one multiply-add per
weight and output voxel) and ``2·b·n_in·n_out`` per dense layer; backward twice that (data
and weight gradients), except the first conv, which needs no data gradient.

Halo widths follow TensorFlow's ``'same'`` padding: ``k − 1`` planes per axis, ``⌊(k−1)/2⌋``
before and the rest after (Keras Conv3D, as the MLPerf reference uses it): a rank needs
``before`` planes from its lower neighbour and ``after`` planes from its upper one for the
forward, the mirror for the data gradient of the backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ConvLayer", "DenseLayer", "conv_layers", "dense_layers", "parameter_count",
           "halo_widths", "local_side", "face_elements"]


@dataclass(frozen=True, slots=True)
class ConvLayer:
    """One Conv3D → LeakyReLU → MaxPool3D block; ``side`` is its input and output size."""

    index: int
    c_in: int
    c_out: int
    side: tuple[int, int, int]
    kernel: int
    pool: int

    @property
    def name(self) -> str:
        return f"conv{self.index}"

    @property
    def params(self) -> int:
        return self.c_in * self.kernel ** 3 * self.c_out + self.c_out

    def flops_per_voxel(self) -> float:
        """Forward FLOPs per output voxel and sample: ``2·C_in·k³·C_out``."""
        return 2.0 * self.c_in * self.kernel ** 3 * self.c_out


@dataclass(frozen=True, slots=True)
class DenseLayer:
    """One fully connected layer, ``n_in`` → ``n_out`` with bias."""

    index: int
    n_in: int
    n_out: int

    @property
    def name(self) -> str:
        return f"dense{self.index}"

    @property
    def params(self) -> int:
        return self.n_in * self.n_out + self.n_out


def conv_layers(m) -> list[ConvLayer]:
    """The conv layers of model section ``m`` (a :class:`CosmoFlowModel`)."""
    out, c_in = [], m.input_shape[3]
    side = tuple(m.input_shape[:3])
    for i in range(m.n_conv_layers):
        c_out = m.conv_size * 2 ** i
        out.append(ConvLayer(i, c_in, c_out, side, m.kernel_size, m.pool_size))
        c_in, side = c_out, tuple(s // m.pool_size for s in side)
    return out


def dense_layers(m) -> list[DenseLayer]:
    """The dense layers of ``m``: flatten → ``fc_sizes`` → ``target_size``."""
    last = conv_layers(m)[-1]
    n_in = math.prod(s // m.pool_size for s in last.side) * last.c_out
    sizes = [n_in, *m.fc_sizes, m.target_size]
    return [DenseLayer(j, a, b) for j, (a, b) in enumerate(zip(sizes, sizes[1:]))]


def parameter_count(m) -> int:
    """Parameters of ``m``: every conv and dense layer's weights and biases."""
    return sum(c.params for c in conv_layers(m)) + sum(d.params for d in dense_layers(m))


def halo_widths(kernel: int) -> tuple[int, int]:
    """(before, after): the planes of ``'same'`` padding on the low and high side of an axis
    (TensorFlow: ``pad_total = k − 1``, ``before = pad_total // 2``)."""
    before = (kernel - 1) // 2
    return before, kernel - 1 - before


def local_side(side: tuple[int, int, int], grid: tuple[int, int, int]) -> tuple[int, ...]:
    """One rank's sub-volume of a ``side`` volume split over ``grid`` (divisibility is
    checked by the family)."""
    return tuple(s // p for s, p in zip(side, grid))


def face_elements(local: tuple[int, ...], axis: int, width: int, channels: int,
                  batch: int) -> int:
    """Elements of a halo face ``width`` planes thick, perpendicular to ``axis``, of a local
    ``local`` volume with ``channels`` channels, for ``batch`` samples."""
    other = math.prod(n for a, n in enumerate(local) if a != axis)
    return width * other * channels * batch
