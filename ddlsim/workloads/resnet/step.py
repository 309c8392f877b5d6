"""The device kernels a PyTorch image-classification training step runs besides the model's
layers and the optimizer update: clearing the gradients, accumulating them, the loss scaler of
fp16 AMP, the input batch's normalisation and mixup on the GPU, and DDP's buffer broadcast.

Each is a ``model`` option of the ``resnet`` family, defaulting to PyTorch 2's defaults and a
bare loop (only DDP's ``broadcast_buffers`` is on, as in DDP); NVIDIA DeepLearningExamples'
``ConvNets`` script (``image_classification/``, commit 729963dd) runs all of them, and
``benchmarks/validate_resnet.py`` sets them as it does.
Nothing here is fitted: byte counts follow the kernels' reads and writes, launches the
framework's code.

* **Zeroed gradients** (``zero_grad: zero``): ``optimizer.zero_grad()`` with PyTorch 1.x's
  default ``set_to_none=False`` (``torch/optim/optimizer.py``, ``p.grad.zero_()`` one
  parameter at a time; the default became ``True`` in 2.0) writes each fp32 ``.grad`` once,
  one kernel per tensor; the next backward's ``AccumulateGrad`` then finds a defined
  gradient and adds the new one in place (``variable_grad += new_grad``,
  ``torch/csrc/autograd/functions/accumulate_grad.h``): one kernel per tensor reading two
  and writing one. With ``set_to_none`` the gradient is stolen, no kernel.
* **GradScaler** (``grad_scaler: true``, fp16 only): ``scaler.scale(loss)`` one multiply;
  ``unscale_`` one multi-tensor kernel family over every fp32 gradient
  (``torch._amp_foreach_non_finite_check_and_unscale_``, a read and a write of each
  element, launched by ``multi_tensor_apply``: at most 110 tensors and 320 chunks of 65,536
  elements per launch, ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``); ``update`` one
  kernel (``torch._amp_update_scale_``). Its ``found_inf.item()`` before the optimizer step
  makes the host wait for the backward, which the optimizer's launches then follow: the
  update op is already timed as host-bound where its kernels are short (``kernels/host.py``).
* **Input on the GPU** (``input_pipeline``): DLE's ``PrefetchedWrapper``
  (``dataloaders.py``) copies the uint8 batch to the device, casts it to fp32 and
  normalises it in place: ``.float()`` (read 1, write 4 bytes an element), ``sub_(mean)``
  and ``div_(std)`` (read 4, write 4 each). ``MixUpWrapper`` (``mixup.py``) then blends the
  batch with a permutation of itself, ``c·x + (1 − c)·x[perm]``: ``c·x`` (8), the gather
  ``x[perm]`` (8), ``(1 − c)·`` (8) and the add (12 bytes an element), and the same four
  on the one-hot targets (``batch × classes`` fp32). The normalisation runs on a side
  stream while the previous step's kernels run; it shares their memory bandwidth and is
  counted here as serial time. The host-to-device copy (copy engine) is not counted.
* **DDP's buffer broadcast** (``broadcast_buffers: true``, DDP's default, data parallel
  only): each forward of a ``DistributedDataParallel`` module first broadcasts its buffers
  from rank 0 (PyTorch 1.9 ``torch/nn/parallel/distributed.py`` ``_sync_params`` →
  ``_distributed_broadcast_coalesced``; ``torch/csrc/distributed/c10d/comm.cpp``
  ``broadcast_coalesced``): the buffers are grouped by dtype (the batch norms' fp32
  ``running_mean`` and ``running_var``, their int64 ``num_batches_tracked``), each group
  flattened into one tensor (``flatten_dense_tensors``: one ``cat`` kernel), broadcast, and
  on every other rank copied back one buffer at a time (``unflatten_dense_tensors`` then
  ``copy_``: one kernel per buffer). 159 small kernels for ResNet-50, issued one by one.
"""

from __future__ import annotations

import math

from ..trace import Kernel
from .layers import Layer, Tensor

__all__ = ["STEP_FIELDS", "INPUT_PIPELINES", "zero_grad_kernels", "accumulate_kernels",
           "grad_scaler_kernels", "multi_tensor_launches", "input_kernels", "bn_buffers",
           "flatten_kernels", "unflatten_kernels"]

#: the ``model`` options of the training step around the model (module docstring)
STEP_FIELDS = ("zero_grad", "grad_scaler", "input_pipeline", "broadcast_buffers")
#: ``model.input_pipeline`` → bytes per input element of each kernel on the device
#: (the module docstring): none, the normalisation, the normalisation then mixup
INPUT_PIPELINES = {"none": (), "normalize": (1 + 4, 8, 8),
                   "normalize_mixup": (1 + 4, 8, 8, 8, 8, 8, 12)}
#: bytes per target element of mixup's four kernels on the one-hot fp32 targets
_MIXUP_TARGET = (8, 8, 8, 12)
#: ``multi_tensor_apply`` at depth 1: elements per chunk, tensors and chunks per launch
#: (PyTorch ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``: ``kChunkSize``,
#: ``depth_to_max_tensors[0]``, ``depth_to_max_blocks[0]``)
_CHUNK, _MAX_TENSORS, _MAX_BLOCKS = 65536, 110, 320
#: fp32 gradients (autocast keeps fp32 parameters and gradients)
_GRAD_BYTES = 4


def _mem(nbytes: float) -> Kernel:
    return Kernel("memory", bytes=float(nbytes))


def zero_grad_kernels(tensors: tuple[Tensor, ...]) -> tuple[Kernel, ...]:
    """``optimizer.zero_grad(set_to_none=False)``: one ``zero_()`` kernel per gradient.

    Parameters
    ----------
    tensors : tuple of Tensor
        the parameters.

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per tensor writing its fp32 gradient (``4·numel`` bytes).
    """
    return tuple(_mem(_GRAD_BYTES * t.numel) for t in tensors)


def accumulate_kernels(tensors: tuple[Tensor, ...]) -> tuple[Kernel, ...]:
    """``AccumulateGrad`` into a defined (zeroed) gradient: ``grad += new_grad`` per tensor.

    Parameters
    ----------
    tensors : tuple of Tensor
        one layer's parameters.

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per tensor, ``3·4·numel`` bytes (read two, write one).
    """
    return tuple(_mem(3 * _GRAD_BYTES * t.numel) for t in tensors)


def multi_tensor_launches(numels: list[int], max_tensors: int = _MAX_TENSORS) -> int:
    """Kernel launches of one ``multi_tensor_apply`` over tensors of ``numels`` elements: a
    launch is issued when it holds ``max_tensors`` tensors (at a tensor's last chunk), 320
    chunks, or the last chunk of the last tensor.

    Parameters
    ----------
    numels : list of int
        elements per tensor, in list order.
    max_tensors : int
        tensors a launch holds: 110 at depth 1 (one tensor list), fewer with more lists
        (``depth_to_max_tensors``).

    Returns
    -------
    int
        launches.

    References
    ----------
    PyTorch ``aten/src/ATen/native/cuda/MultiTensorApply.cuh`` (``multi_tensor_apply``).
    """
    launches = tensors = blocks = 0
    for i, n in enumerate(numels):
        tensors += 1
        chunks = max(1, math.ceil(n / _CHUNK))
        for c in range(chunks):
            blocks += 1
            last = c == chunks - 1
            if (tensors == max_tensors and last) or blocks == _MAX_BLOCKS \
                    or (last and i == len(numels) - 1):
                launches += 1
                blocks = 0
                tensors = 0 if last else 1      # an unfinished tensor carries over
    return launches


def grad_scaler_kernels(tensors: tuple[Tensor, ...]) -> tuple[Kernel, ...]:
    """``torch.cuda.amp.GradScaler``'s kernels in one step: ``unscale_`` over every fp32
    gradient (read + write, spread over :func:`multi_tensor_launches` launches) and
    ``update`` (one kernel); the loss's ``scale`` multiply is one more launch of a scalar.

    Parameters
    ----------
    tensors : tuple of Tensor
        the parameters.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels: the unscale launches, each an equal share of ``2·4·params``
        bytes, then the two scalar kernels.
    """
    launches = multi_tensor_launches([t.numel for t in tensors])
    total = 2 * _GRAD_BYTES * sum(t.numel for t in tensors)
    return tuple(_mem(total / launches) for _ in range(launches)) + (_mem(8), _mem(8))


def input_kernels(pipeline: str, mb: int, image_size: int, classes: int
                  ) -> tuple[Kernel, ...]:
    """The input batch's kernels on the device for ``model.input_pipeline`` (module
    docstring): the normalisation's and mixup's passes over ``mb`` RGB images, mixup's over
    the ``mb × classes`` one-hot targets.

    Parameters
    ----------
    pipeline : str
        a key of :data:`INPUT_PIPELINES`.
    mb : int
        images in the micro-batch.
    image_size : int
        image height = width (pixels).
    classes : int
        the classifier's outputs (one-hot target width).

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each; none for ``none``.
    """
    pixels = 3 * mb * image_size ** 2
    out = [_mem(b * pixels) for b in INPUT_PIPELINES[pipeline]]
    if pipeline == "normalize_mixup":
        out += [_mem(b * mb * classes) for b in _MIXUP_TARGET]
    return tuple(out)


def bn_buffers(layers: tuple[Layer, ...]) -> dict[str, tuple[float, ...]]:
    """The module buffers DDP broadcasts, in bytes, grouped by dtype: per batch norm of
    ``C`` channels its ``running_mean`` and ``running_var`` (fp32, ``4·C`` bytes each) and
    its ``num_batches_tracked`` (one int64, 8 bytes).

    Parameters
    ----------
    layers : tuple of Layer
        the model's layers.

    Returns
    -------
    dict
        ``{"fp32": bytes per buffer, "int64": bytes per buffer}``, registration order.
    """
    channels = [layer.params[0].numel for layer in layers if layer.kind == "bn"]
    return {"fp32": tuple(4.0 * c for c in channels for _ in range(2)),
            "int64": tuple(8.0 for _ in channels)}


def flatten_kernels(buffers: dict[str, tuple[float, ...]]) -> tuple[Kernel, ...]:
    """``flatten_dense_tensors`` of each dtype group: one ``cat`` kernel reading and
    writing the group's bytes.

    Parameters
    ----------
    buffers : dict
        :func:`bn_buffers`.

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per non-empty group.
    """
    return tuple(_mem(2 * sum(b)) for b in buffers.values() if b)


def unflatten_kernels(buffers: dict[str, tuple[float, ...]]) -> tuple[Kernel, ...]:
    """The broadcast buffers copied back on a rank other than the root: one ``copy_`` per
    buffer, reading and writing its bytes.

    Parameters
    ----------
    buffers : dict
        :func:`bn_buffers`.

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per buffer.
    """
    return tuple(_mem(2 * b) for group in buffers.values() for b in group)
