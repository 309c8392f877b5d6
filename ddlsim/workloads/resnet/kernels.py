"""The device kernels of a ResNet layer as PyTorch runs it: cuDNN implicit-GEMM convolutions,
memory-bound passes, autocast's casts, DDP's gradient copies and the SGD update.

Each function returns :class:`~ddlsim.workloads.trace.Kernel` records that the kernel model
times (``ddlsim/simulator/kernels``: a GEMM by its shape, with tile and wave quantisation; a
memory kernel at the device's achieved bandwidth) and launches one by one (host and launch
time, ``kernels/host.py``). Nothing here is fitted.

* **Convolution as implicit GEMM** (NVIDIA, "Convolutional Layers User's Guide", section
  "Convolution Algorithms", the implicit-GEMM dimensions): forward ``M = N·P·Q``, ``N = K``,
  ``K = C·R·S``; data gradient ``M = N·H·W``, ``N = C``, ``K = K·R·S``; weight gradient
  ``M = C·R·S``, ``N = K``, ``K = N·P·Q`` (``N`` images, ``C`` input and ``K`` output channels,
  ``R×S`` filter, ``H×W`` input, ``P×Q`` output). A strided convolution's data gradient is
  taken at ``N·P·Q`` rows, so that it has the forward's FLOPs (cuDNN's strided dgrad kernels
  skip the zeros a stride inserts). The first convolution computes no data gradient: the
  image does not require one (autograd's ``output_mask`` of ``convolution_backward``).
  Each GEMM moves the tensors once (the guide's arithmetic intensity of a convolution
  counts input, filter and output), not the ``N·P·Q × C·R·S`` im2col matrix its shape names:
  an implicit GEMM builds that operand's tiles on chip from the input (``_conv_bytes``).
* **Layout** (the same guide, "Tensor Layouts In Memory: NCHW vs NHWC"): Tensor Core
  convolutions run on NHWC; with PyTorch's default NCHW (``contiguous``) tensors, cuDNN
  transposes a convolution's input to NHWC and its output back, a read and a write of each.
  Counted for the Tensor Core dtypes (fp16, bf16, tf32) only: FP32 convolutions run without
  Tensor Cores in either layout. Backward: the incoming gradient and the input (for the
  weight gradient) are transposed in, the data gradient out.
* **Memory passes** (element counts × the activation dtype), per PyTorch's kernels: batch
  norm forward reads its input twice (the batch statistics first, then the normalisation)
  and writes once; its backward reads input and gradient for the two reductions and again to
  write the input gradient (5); ReLU in place reads and writes (2), its backward
  (``threshold_backward``) reads gradient and output and writes (3); the residual add reads
  two and writes one (3), and its backward is the sum of the two gradients where the block's
  input forked (3); max pooling writes int64 indices beside its output
  (``max_pool2d_with_indices``) and its backward zeroes the input gradient before scattering.
* **The stem** (the convolution that reads the image, :attr:`Layer.image`), measured one by
  one in a Kineto trace of the step on one H200 (``benchmarks/resnet_kernels_trace.py``):
  under fp16/bf16 autocast the fp32 image is cast to the autocast dtype inside
  ``aten::conv2d`` (read 4, write 2 bytes an element; the first convolution's largest cast
  in the trace, 55 µs at batch 256); and a Tensor Core NHWC convolution whose input channels
  are not a multiple of 8 runs cuDNN's 4-channel first-layer kernels
  (``sm90_xmma_{fprop,wgrad}_image_first_layer_..._k64c4r7s7``), so cuDNN pads the 3-channel
  image to 4 channels before the forward and again before the weight gradient: a memset of the
  padded copy, ``nhwcAddPaddingKernel`` (read 3, write 4 channels) and the filter's own pad (or
  its gradient's unpad), three launches each time (:func:`stem_kernels`).
* **Kernel classes** (``Kernel.variant``): with channels-last tensors PyTorch trains batch
  norm in cuDNN's ``CUDNN_BATCHNORM_SPATIAL_PERSISTENT`` mode (PyTorch
  ``aten/src/ATen/native/cudnn/BatchNorm.cpp``, ``getCudnnBatchNormMode``), whose
  semi-persistent kernels (``batchnorm_{fw,bw}tr_nhwc_semiPersist``) run one wave of
  512-thread CTAs with a grid-wide reduction between their passes, and max pooling in its
  NHWC kernels (``max_pool_{forward,backward}_nhwc``, ``DilatedMaxPool2d.cu``: a 3×3 window
  read per output, the backward gathering each input's gradient from the windows that cover
  it): their kernels carry classes ``batchnorm``, ``batchnorm_backward``, ``maxpool``,
  ``maxpool_backward``, timed at a device's achieved bandwidth for the class where it has
  measured one (``device.elementwise_efficiency``), else at its streaming bandwidth. With
  contiguous (NCHW) tensors PyTorch runs cuDNN's ``CUDNN_BATCHNORM_SPATIAL`` mode
  (``bn_fw_tr_1C11_kernel_NCHW`` and ``bn_bw_1C11_kernel_new``, their ``singleread`` forms for
  small spatial sizes) and its NCHW max pooling (``max_pool_{forward,backward}_nchw``): classes
  ``batchnorm_nchw``, ``batchnorm_nchw_backward``, ``maxpool_nchw``, ``maxpool_nchw_backward``
  (the kernels of the H200's TF32 trace, ``benchmarks/data/device_h200_2026-11-30/run11``). The
  passes counted are those above, whatever the class.
"""

from __future__ import annotations

from ...config import DTYPE_BYTES
from ..trace import Kernel
from .layers import Layer, Tensor

__all__ = ["TENSOR_CORE_DTYPES", "NHWC_CLASSES", "NCHW_CLASSES", "conv_kernels", "stem_kernels",
           "pointwise_kernels", "autocast_casts", "ddp_copies", "sgd_kernels"]

#: dtypes whose convolutions run on Tensor Cores (NHWC kernels); fp32 runs on the CUDA cores
TENSOR_CORE_DTYPES = frozenset({"fp16", "bf16", "tf32"})
#: bytes of a max-pooling index (``max_pool2d_with_indices`` returns int64 indices)
_INDEX_BYTES = 8
#: tensor passes (reads + writes) of each point-wise layer: (forward, backward), see above
_PASSES = {"bn": (3, 5), "relu": (2, 3), "add": (3, 3)}
#: the kernel class of a channels-last layer's (forward, backward) kernels (module docstring)
NHWC_CLASSES = {"bn": ("batchnorm", "batchnorm_backward"),
                "maxpool": ("maxpool", "maxpool_backward")}
#: the kernel class of a contiguous (NCHW) layer's (forward, backward) kernels: cuDNN's
#: ``CUDNN_BATCHNORM_SPATIAL`` kernels (``bn_fw_tr_1C11_*``, ``bn_bw_1C11_*``) and PyTorch's
#: ``max_pool_{forward,backward}_nchw`` (module docstring)
NCHW_CLASSES = {"bn": ("batchnorm_nchw", "batchnorm_nchw_backward"),
                "maxpool": ("maxpool_nchw", "maxpool_nchw_backward")}
#: autocast's 16-bit dtypes (the fp32 image is cast to them in the stem)
_AUTOCAST = ("fp16", "bf16")
#: input channels a Tensor Core convolution takes without padding: multiples of 8 at 16 bits;
#: a 3-channel image "padding to 4 channels is sufficient if a stride of 2 is used" (NVIDIA,
#: "Convolutional Layers User's Guide", QuickStart Checklist and "Channels In And Out"): the
#: 4 channels of cuDNN's first-layer kernels in the trace (module docstring)
_CHANNEL_MULTIPLE, _STEM_CHANNELS = 8, 4


def _mem(nbytes: float, variant: str = "") -> Kernel:
    return Kernel("memory", bytes=float(nbytes), variant=variant)


def conv_kernels(layer: Layer, mb: int, dtype: str, backward: bool, channels_last: bool,
                 input_grad: bool = True) -> tuple[Kernel, ...]:
    """A convolution's (or the fully connected layer's) kernels on ``mb`` images.

    Parameters
    ----------
    layer : Layer
        a ``conv`` or ``fc`` layer (its ``geometry``: C, K, R, P).
    mb : int
        images in the micro-batch.
    dtype : str
        ``train.dtype``: the GEMMs' arithmetic (fp16, bf16, tf32, fp32).
    backward : bool
        the data- and weight-gradient GEMMs instead of the forward one.
    channels_last : bool
        NHWC activations (``torch.channels_last``): no layout transposes.
    input_grad : bool
        compute the data gradient (False for the first layer: the image needs none).

    Returns
    -------
    tuple of Kernel
        the GEMMs (forward; data, then weight gradient), then the layout transposes.
    """
    c, k, r, p = layer.geometry
    npq, crs, w = float(mb * p * p), float(c * r * r), DTYPE_BYTES[dtype]
    fwd, dgrad, wgrad = _conv_bytes(layer, mb, w)
    if not backward:
        gemms = [Kernel("gemm", (npq, float(k), crs), dtype=dtype, bytes=fwd)]
    else:
        gemms = [Kernel("gemm", (npq, float(c), float(k * r * r)), dtype=dtype, bytes=dgrad)] \
            if input_grad else []
        gemms.append(Kernel("gemm", (crs, float(k), npq), dtype=dtype, bytes=wgrad))
    if channels_last or dtype not in TENSOR_CORE_DTYPES or layer.kind != "conv":
        return tuple(gemms)
    x, y = mb * layer.inp * w, mb * layer.out * w
    moved = [x, y] if not backward else [y, x] + ([x] if input_grad else [])
    return tuple(gemms) + tuple(_mem(2 * b) for b in moved)


def stem_kernels(layer: Layer, mb: int, dtype: str, backward: bool,
                 channels_last: bool) -> tuple[Kernel, ...]:
    """The stem's kernels beside its convolution's (module docstring): autocast's cast of the
    fp32 image in the forward, and cuDNN's padding of its 3 channels to 4 before the forward
    and before the weight gradient (:func:`_stem_pad`); none for any other layer.

    Parameters
    ----------
    layer : Layer
        any layer (only the one with :attr:`Layer.image` has such kernels).
    mb : int
        images in the micro-batch.
    dtype : str
        ``train.dtype``: fp16 and bf16 run under autocast.
    backward : bool
        the kernels before the weight gradient instead of the forward's.
    channels_last : bool
        NHWC activations: cuDNN's NHWC first-layer kernels, which take 4 channels.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each.
    """
    if not layer.image:
        return ()
    cast = (_mem((4 + DTYPE_BYTES[dtype]) * mb * layer.inp),) \
        if dtype in _AUTOCAST and not backward else ()
    return cast + (_stem_pad(layer, mb, dtype) if channels_last else ())


def _stem_pad(layer: Layer, mb: int, dtype: str) -> tuple[Kernel, ...]:
    """cuDNN's padding of a 3-channel stem to its 4-channel first-layer kernels (module
    docstring): the memset of the padded image (write 4 channels), the pad (read 3, write 4
    channels), the filter's pad in the forward or its gradient's unpad in the backward (read
    4, write 3 channels of ``K·R·S``); none where the stem needs no padding (32-bit or
    CUDA-core arithmetic, or channels a multiple of 8)."""
    c, k, r, _ = layer.geometry
    if dtype not in _AUTOCAST or c % _CHANNEL_MULTIPLE == 0:
        return ()
    w, pixels, taps = DTYPE_BYTES[dtype], mb * layer.inp / c, k * r * r
    return (_mem(w * _STEM_CHANNELS * pixels), _mem(w * (c + _STEM_CHANNELS) * pixels),
            _mem(w * (c + _STEM_CHANNELS) * taps))


def _conv_bytes(layer: Layer, mb: int, w: float) -> tuple[float, float, float]:
    """DRAM bytes of a convolution's forward, data- and weight-gradient implicit GEMMs: each
    tensor once (input ``X``, filter, output ``Y`` and their gradients), the input no more
    than the ``N·P·Q × C·R·S`` operand its GEMM shape names (a strided 1×1 convolution reads
    every other pixel) and no less than the tensor for a wider filter (the ``R·S`` window's
    reuse stays on chip, so an ``R×S`` filter does not read the input ``R·S`` times). The fully
    connected layer: 0, its GEMM operands are its tensors."""
    if layer.kind != "conv":
        return 0.0, 0.0, 0.0
    c, k, r, p = layer.geometry
    x = w * min(mb * layer.inp, mb * p * p * c * r * r)
    dx, y, filt = w * mb * layer.inp, w * mb * layer.out, w * c * k * r * r
    return x + filt + y, y + filt + dx, x + y + filt


def pointwise_kernels(layer: Layer, mb: int, dtype: str, backward: bool,
                      channels_last: bool = False) -> tuple[Kernel, ...]:
    """A batch norm, ReLU, residual add or pooling layer as one memory kernel (two for the
    max-pooling backward: zero, then scatter), its bytes by the passes above; a batch norm's
    and a max pooling's kernels carry their class (:data:`NHWC_CLASSES` with channels-last
    tensors, :data:`NCHW_CLASSES` without; the max-pooling backward's zeroing is a plain
    fill).

    Parameters
    ----------
    layer : Layer
        a ``bn``, ``relu``, ``add``, ``maxpool`` or ``avgpool`` layer.
    mb : int
        images in the micro-batch.
    dtype : str
        ``train.dtype`` (the activations' element size).
    backward : bool
        the layer's backward kernels instead of its forward ones.
    channels_last : bool
        NHWC activations (``torch.channels_last``): cuDNN's persistent batch norm and
        PyTorch's NHWC max pooling.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each.
    """
    w = DTYPE_BYTES[dtype]
    x, y = mb * layer.inp * w, mb * layer.out * w
    classes = NHWC_CLASSES if channels_last else NCHW_CLASSES
    cls = classes[layer.kind][backward] if layer.kind in classes else ""
    if layer.kind == "maxpool":
        idx = mb * layer.out * _INDEX_BYTES
        return (_mem(x + y + idx, cls),) if not backward else (_mem(x), _mem(y + idx + x, cls))
    if layer.kind == "avgpool":
        return (_mem(x + y),)
    fwd, bwd = _PASSES[layer.kind]
    return (_mem((bwd if backward else fwd) * y, cls),)


def autocast_casts(layer: Layer, dtype: str, backward: bool) -> tuple[Kernel, ...]:
    """``torch.autocast``'s weight casts of a convolution or linear layer: forward, its fp32
    weight cast to ``dtype`` (read 4, write 2 bytes a parameter; once per forward, autocast's
    cast cache); backward, the 16-bit weight gradient cast back to the fp32 ``.grad`` (read 2,
    write 4). None for other layers or dtypes.

    Parameters
    ----------
    layer : Layer
        any layer (only ``conv`` and ``fc`` have casts).
    dtype : str
        ``train.dtype``: fp16 or bf16 run under autocast.
    backward : bool
        the gradient's cast back (same bytes as the forward's).

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel of ``(4 + 2)·parameters`` bytes, or none.
    """
    if dtype not in ("fp16", "bf16") or layer.kind not in ("conv", "fc"):
        return ()
    return (_mem((4 + DTYPE_BYTES[dtype]) * layer.params[0].numel),)


def ddp_copies(tensors: tuple[Tensor, ...], grad_bytes: float) -> tuple[Kernel, ...]:
    """DDP's copy of each gradient into its bucket, or back out of it after the all-reduce,
    one kernel per tensor (``gradient_as_bucket_view=False``, DDP's default: the gradient and
    the bucket are separate memory; PyTorch ``torch/csrc/distributed/c10d/reducer.cpp``,
    ``mark_variable_ready_dense``, whose ``copy_grad_to_bucket`` divides by the world size as
    it copies, and ``finalize_bucket_dense``).

    Parameters
    ----------
    tensors : tuple of Tensor
        the parameters whose gradients are copied.
    grad_bytes : float
        bytes of a gradient element (4 under autocast).

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per tensor, ``2·grad_bytes·numel`` bytes (read + write).
    """
    return tuple(_mem(2 * grad_bytes * t.numel) for t in tensors)


def sgd_kernels(tensors: tuple[Tensor, ...], decayed: tuple[bool, ...]) -> tuple[Kernel, ...]:
    """``torch.optim.SGD`` with momentum, one parameter at a time (PyTorch 1.x's per-parameter
    loop, ``torch/optim/_functional.py`` ``sgd`` in 1.9; the multi-tensor ``foreach`` path
    became the default in 2.0), fp32: the weight
    decay ``d_p.add(param, alpha=wd)`` (read 2, write 1) where the tensor is decayed, the
    momentum ``buf.mul_(m).add_(d_p)`` (two kernels: read 1 write 1, read 2 write 1) and the
    step ``param.add_(d_p, alpha=-lr)`` (read 2, write 1); 4 bytes an element each.

    Parameters
    ----------
    tensors : tuple of Tensor
        the parameters, in registration order.
    decayed : tuple of bool
        per tensor, whether weight decay applies to it.

    Returns
    -------
    tuple of Kernel
        3 or 4 ``memory`` kernels per tensor.
    """
    out: list[Kernel] = []
    for t, wd in zip(tensors, decayed):
        passes = ((3,) if wd else ()) + (2, 3, 3)
        out += [_mem(4 * p * t.numel) for p in passes]
    return tuple(out)
