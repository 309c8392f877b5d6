"""The device kernels a BERT pre-training step runs besides the layers' own: the gradients'
accumulation over the micro-batches of one optimizer step (``model.grad_accumulation``).

Each micro-batch's backward makes a fresh gradient of every parameter; where the step has
several micro-batches, something adds it to the ones before. How, depends on the stack
(nothing here is fitted: byte counts follow the kernels' reads and writes, launches the
framework's code):

* ``none``: not counted (the default; the gradients are taken to accumulate for free).
* ``autograd``: ``AccumulateGrad`` finds a defined ``.grad`` and adds the new gradient in
  place (``variable_grad += new_grad``, ``torch/csrc/autograd/functions/accumulate_grad.h``):
  one kernel per tensor reading two and writing one element of the model's dtype, on every
  micro-batch but the first (whose gradient is stolen into the ``.grad`` the previous
  optimizer step set to None). NVIDIA DeepLearningExamples' BERT at 78ec6802 without fp16
  (``run_pretraining.py`` line 608 ``loss.backward()``; 480-481 ``param.grad = None``) and
  at 729963dd (DDP's ``no_sync``, ``gradient_as_bucket_view``: fp16 ``.grad`` with AMP's
  ``model.half()``).
* ``apex_master``: apex amp ``O2`` (DeepLearningExamples' BERT at 78ec6802 with fp16,
  ``amp.initialize(..., opt_level="O2")``, ``amp.scale_loss``): before each backward the
  fp16 model gradients are set to None; after it, ``post_backward_with_master_weights``
  (``apex/amp/_process_optimizer.py``) unscales them into the fp32 master gradients: on the
  first micro-batch ``multi_tensor_scale`` (read 2, write 4 bytes an element, two tensor
  lists), on every later one ``multi_tensor_axpby`` adding them to the stashed fp32 ones
  (read 2 + 4, write 4 bytes, three lists), each launched by ``multi_tensor_apply``
  (``apex/csrc/multi_tensor_apply.cuh``: chunks of 2048·32 elements, ``amp``'s
  ``LossScaler``; at most 64 tensors with two lists, 48 with three, 320 chunks a launch).
"""

from __future__ import annotations

from ..resnet.step import multi_tensor_launches
from ..trace import Kernel

__all__ = ["GRAD_ACCUMULATIONS", "autograd_accumulate_kernels", "apex_master_kernels"]

#: ``model.grad_accumulation`` values (module docstring)
GRAD_ACCUMULATIONS = ("none", "autograd", "apex_master")
#: apex ``multi_tensor_apply``: tensors a launch holds with 2 and 3 tensor lists
#: (``depth_to_max_tensors[5] = {110, 64, 48, 36, 30}``)
_APEX_MAX_TENSORS = {2: 64, 3: 48}
#: bytes an element of (fp16 model gradient, fp32 master gradient) the first micro-batch's
#: ``multi_tensor_scale`` and a later one's ``multi_tensor_axpby`` move
_APEX_BYTES = {True: 2 + 4, False: 2 + 4 + 4}


def autograd_accumulate_kernels(numels: list[int], dtype_bytes: float) -> tuple[Kernel, ...]:
    """``AccumulateGrad`` into a defined ``.grad``: ``grad += new_grad`` per tensor.

    Parameters
    ----------
    numels : list of int
        elements of each parameter tensor.
    dtype_bytes : float
        bytes per gradient element (B).

    Returns
    -------
    tuple of Kernel
        one ``memory`` kernel per tensor, ``3·dtype_bytes·numel`` bytes (read two, write one).
    """
    return tuple(Kernel("memory", bytes=3.0 * dtype_bytes * n) for n in numels)


def apex_master_kernels(numels: list[int], first: bool) -> tuple[Kernel, ...]:
    """apex amp O2's unscale of the fp16 model gradients into the fp32 master gradients after
    one backward (module docstring): ``multi_tensor_scale`` on the ``first`` micro-batch of
    a step, ``multi_tensor_axpby`` on a later one.

    Parameters
    ----------
    numels : list of int
        elements of each parameter tensor.
    first : bool
        the step's first micro-batch (no stashed fp32 gradient yet).

    Returns
    -------
    tuple of Kernel
        the launches, each an equal share of the pass's bytes.
    """
    depth = 2 if first else 3
    launches = multi_tensor_launches(numels, _APEX_MAX_TENSORS[depth])
    total = _APEX_BYTES[first] * float(sum(numels))
    return tuple(Kernel("memory", bytes=total / launches) for _ in range(launches))
