"""The layers of a bottleneck ResNet (He et al. 2016), as torchvision defines them.

Every layer of ``torchvision.models.resnet`` (v1.5: the stride sits on the 3×3 convolution of a
bottleneck) in forward execution order, with its parameter tensors in registration order,
its forward FLOPs and its output size per sample. Counts are exact closed forms of the
definition; nothing is fitted.

Conventions
-----------
* FLOPs: a multiply-add is 2 FLOPs. Convolution ``2·(C_in/groups)·k²·C_out·H_out·W_out``;
  fully connected ``2·in·out`` (+ ``out`` for the bias); batch norm 4 per element at training
  (mean, variance, normalise, scale-shift: Hoffer et al.'s count is close enough here, the
  GEMMs dominate); ReLU 1; residual add 1; pooling one per window element read.
  torchvision's model card reports *multiply-adds* as "GFLOPS" (ResNet-50: 4.09,
  ResNet-152: 11.51), i.e. half of our convolution + fc FLOPs.
* Parameter order: torchvision registers a bottleneck's ``conv1, bn1, conv2, bn2, conv3, bn3``
  and then its projection shortcut ``downsample.0`` (conv) and ``downsample.1`` (BN); a BN
  registers ``weight`` then ``bias``. ``shortcut_first=True`` lists the shortcut before
  ``conv1`` instead, the order of TF-slim's ``resnet_v1`` variables (``shortcut`` scope
  created first in ``bottleneck``), which the DNN-cpp-proxies gradient list follows.

References
----------
He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016, Table 1.
torchvision ``torchvision/models/resnet.py`` (``Bottleneck``, ``ResNet._make_layer``,
``resnet50``: layers [3, 4, 6, 3]; ``resnet152``: [3, 8, 36, 3]).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Tensor", "Layer", "resnet_layers", "BLOCKS"]

#: Bottleneck blocks per stage (He et al. 2016, Table 1; torchvision ``resnet*``).
BLOCKS: dict[int, tuple[int, int, int, int]] = {
    50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
_WIDTHS = (64, 128, 256, 512)       # planes of each stage; outputs are 4× (expansion)
_EXPANSION = 4


@dataclass(frozen=True, slots=True)
class Tensor:
    """One trainable parameter tensor: its torchvision name and element count."""

    name: str
    numel: int


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer in forward order.

    ``kind`` is ``conv``, ``bn``, ``relu``, ``maxpool``, ``add``, ``avgpool`` or ``fc``;
    ``flops`` the forward FLOPs per sample; ``out`` and ``inp`` the output and input
    elements per sample; ``params`` its trainable tensors in registration order;
    ``geometry`` of a convolution ``(C_in, C_out, k, H_out)`` (a ``k×k`` filter, an
    ``H_out×H_out`` output), of the fully connected layer ``(in, out, 1, 1)``, else empty;
    ``image``: the layer reads the model's input, the fp32 RGB batch (the stem convolution).
    """

    name: str
    kind: str
    flops: float
    inp: int
    out: int
    params: tuple[Tensor, ...] = ()
    geometry: tuple[int, ...] = ()
    image: bool = False

    @property
    def gemm(self) -> bool:
        return self.kind in ("conv", "fc")


class _Net:
    """Accumulates layers while tracking the activation shape ``(C, H, W)``."""

    def __init__(self, image: int):
        self.c, self.h = 3, image
        self.layers: list[Layer] = []

    def conv(self, name: str, c_out: int, k: int, stride: int, image: bool = False) -> None:
        h_out = (self.h + 2 * (k // 2) - k) // stride + 1
        w = Tensor(f"{name}.weight", self.c * k * k * c_out)
        self.layers.append(Layer(name, "conv", 2.0 * w.numel * h_out * h_out,
                                 self.c * self.h ** 2, c_out * h_out ** 2, (w,),
                                 (self.c, c_out, k, h_out), image))
        self.c, self.h = c_out, h_out

    def bn(self, name: str) -> None:
        n = self.c * self.h ** 2
        self.layers.append(Layer(name, "bn", 4.0 * n, n, n,
                                 (Tensor(f"{name}.weight", self.c), Tensor(f"{name}.bias", self.c))))

    def pointwise(self, name: str, kind: str) -> None:
        n = self.c * self.h ** 2
        self.layers.append(Layer(name, kind, float(n), n if kind == "relu" else 2 * n, n))


def _bottleneck(net: _Net, name: str, planes: int, stride: int, shortcut_first: bool) -> None:
    c_in, h_in = net.c, net.h
    needs_proj = stride != 1 or c_in != planes * _EXPANSION
    sub = _Net(0)
    sub.c, sub.h = c_in, h_in
    for i, (width, k, s) in enumerate(((planes, 1, 1), (planes, 3, stride),
                                       (planes * _EXPANSION, 1, 1)), start=1):
        sub.conv(f"{name}.conv{i}", width, k, s)
        sub.bn(f"{name}.bn{i}")
        if i < 3:
            sub.pointwise(f"{name}.relu{i}", "relu")
    main = sub.layers
    proj: list[Layer] = []
    if needs_proj:
        ps = _Net(0)
        ps.c, ps.h = c_in, h_in
        ps.conv(f"{name}.downsample.0", planes * _EXPANSION, 1, stride)
        ps.bn(f"{name}.downsample.1")
        proj = ps.layers
    net.layers += (proj + main) if shortcut_first else (main + proj)
    net.c, net.h = sub.c, sub.h
    net.pointwise(f"{name}.add", "add")
    net.pointwise(f"{name}.relu", "relu")


@lru_cache(maxsize=64)
def resnet_layers(depth: int, num_classes: int = 1000, image_size: int = 224,
                  shortcut_first: bool = False) -> tuple[Layer, ...]:
    """The layers of torchvision's ``resnet{depth}`` in forward order.

    Parameters
    ----------
    depth : int
        50, 101 or 152 (:data:`BLOCKS`).
    num_classes : int
        Outputs of the classifier (ImageNet: 1000; TF-slim checkpoints: 1001, with a
        background class).
    image_size : int
        Input height = width in pixels (224 in He et al. 2016).
    shortcut_first : bool
        List each projection shortcut before its block's ``conv1`` (TF-slim's variable order)
        instead of after ``bn3`` (torchvision's).

    Returns
    -------
    tuple of Layer
    """
    net = _Net(image_size)
    net.conv("conv1", 64, 7, 2, image=True)
    net.bn("bn1")
    net.pointwise("relu", "relu")
    h_in = net.h
    net.h = (net.h + 2 - 3) // 2 + 1                 # 3×3 max pool, stride 2, padding 1
    n = net.c * net.h ** 2
    net.layers.append(Layer("maxpool", "maxpool", 9.0 * n, net.c * h_in ** 2, n))
    for stage, (blocks, planes) in enumerate(zip(BLOCKS[depth], _WIDTHS), start=1):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            _bottleneck(net, f"layer{stage}.{b}", planes, stride, shortcut_first)
    pooled = net.c
    net.layers.append(Layer("avgpool", "avgpool", float(pooled * net.h ** 2),
                            pooled * net.h ** 2, pooled))
    w = Tensor("fc.weight", pooled * num_classes)
    net.layers.append(Layer("fc", "fc", 2.0 * w.numel + num_classes, pooled, num_classes,
                            (w, Tensor("fc.bias", num_classes)), (pooled, num_classes, 1, 1)))
    return tuple(net.layers)
