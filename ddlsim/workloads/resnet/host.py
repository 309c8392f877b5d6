"""The host (CPU) time of an eager ResNet training step per layer op, measured: what PyTorch's
host does for a convolution, a batch norm, an autograd node, beyond launching its kernels.

ddlsim's host model charges every kernel ``h = eager_op_s + host_launch_s`` (the device's
``launch`` facts: a tiny op, ``x.add_(1)`` in a Python loop; :mod:`ddlsim.simulator.kernels.host`).
A layer op costs its host far more than its kernels' ``n·h``: ``nn.Module.__call__``, cuDNN's
execution-plan lookup and workspace allocation before each convolution and batch norm, the
autocast cast of each weight, the batch norm's ``num_batches_tracked.add_(1)``, and in the
backward the autograd engine's per-node work (``evaluate_function``, the node's
``ConvolutionBackward0``/``CudnnBatchNormBackward0``, the cast's ``ToCopyBackward0`` and each
weight's ``AccumulateGrad``). Where the kernels are short (small batches) the step is then
host-bound: on one H200, batch 32 and 64 (AMP, channels-last) ran 25-33 ms a step, no faster
than batch 128 (26.8 ms), while ddlsim's kernel launches alone gave 11-15 ms.

**Measured.** :data:`HOST_UNITS` is each op's host time in units of the same host's tiny op,
read by ``benchmarks/resnet_host_trace.py`` from the Kineto traces of one step of torchvision's
ResNet-50 under DeepLearningExamples' recipe (``benchmarks/device/resnet_step.py --trace``: AMP
fp16 with GradScaler, channels-last, torch 2.11, cuDNN 9.19, one H200, batch 32 and 256;
``benchmarks/data/device_h200_2026-11-30/run4/resnet/``): per op, the median of its events'
host time (each root CPU event's duration plus the gap since the previous root on its thread),
divided by the median duration of the trace's ``num_batches_tracked.add_(1)`` (the tiny op
``launch_time.py`` times for ``h``; 11.3 and 12.2 µs under the profiler). A ratio of two
profiled times: the profiler's cost per recorded event is in both and cancels to first order,
and the device's own ``h`` sets the scale (7.2 µs measured on the H200's host,
``run1/launch.json``). The tiny op in the trace is its dispatch and launch without its
Python call (0.7 µs on that host: ``launch.json``'s eager less TorchScript figure), so the
units are up to 10 % high. The two traces' forward ops agree within 15 %, their backward and
update ops differ by up to 1.8× (the host's own variance: the same ops, one step after the
other; the measured steps at batch 32 spread 24-35 ms); the table takes their mean.

**Charged**, under eager dispatch only (compiled code and CUDA graphs run no per-op Python;
:func:`~ddlsim.simulator.kernels.host.eager_unit_s`): each layer op's units times ``h``, its launches included
(:func:`layer_host_s` with no kernels), as a host op on the ``host`` stream before it
(:func:`issued_by_host`): the host runs ahead of the device and its lead carries from op to
op, so a small batch is host-bound (the step is the host's work) and a large one is not slowed
(its kernels outlast the host's work; the host waits only at the GradScaler's
``found_inf.item()``, which the update's per-op timing already holds: the optimizer is issued
after the device's backward). Where the host's lead drains within a step (batch 128 on an
H200) the two overlap op by op. A convolution's autocast cast (forward: its weight to fp16;
backward: ``ToCopyBackward0``, the gradient back to fp32) is measured apart and counted under
fp16/bf16 autocast only. The fully connected layer carries the loss (forward: ``linear``,
``cross_entropy`` with label smoothing, ``scaler.scale`` and ``backward()``'s seed; backward:
the loss's nodes, then ``AddmmBackward0`` with its casts and grads), and the average pool the
flatten. The GradScaler's host work (its ``unscale_``'s Python over every gradient, the scale
update) is a host op before its kernels; ``zero_grad``'s per-parameter loop, issued after the
optimizer (so after the GradScaler's wait), is its op's ``host_s`` beyond its 161 launches
(:attr:`~ddlsim.workloads.trace.Compute.host_s`). The SGD step is charged nothing more:
torch 2.11 ran the multi-tensor (``foreach``) SGD, 13 launches and 176-259 units, where
ddlsim's per-tensor SGD of PyTorch 1.x (DeepLearningExamples' era,
:func:`.kernels.sgd_kernels`) already launches 644 kernels.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..hoststream import lay_host_ops
from ..trace import Op

__all__ = ["HOST_UNITS", "layer_host_s", "issued_by_host"]

#: host time per op in tiny-op units (module docstring), ``(pass, kind)`` → units; beside each,
#: the batch-32 and batch-256 traces' figures (``benchmarks/resnet_host_trace.py``), whose
#: mean it is
HOST_UNITS: dict[tuple[str, str], float] = {
    ("fwd", "conv"): 5.34,          # 5.22, 5.45: cudnn_convolution (its cast apart)
    ("fwd", "cast"): 1.77,          # 1.70, 1.83: autocast's weight cast (aten::to in conv2d)
    ("fwd", "bn"): 7.56,            # 7.35, 7.76: num_batches_tracked.add_ + cudnn_batch_norm
    ("fwd", "relu"): 1.91,          # 1.88, 1.95
    ("fwd", "add"): 1.55,           # 1.55, 1.55
    ("fwd", "maxpool"): 5.07,       # 4.91, 5.23
    ("fwd", "avgpool"): 9.16,       # 9.78, 8.54: adaptive_avg_pool2d + flatten
    ("fwd", "fc"): 73.00,           # 74.99, 71.01: linear + the loss + scale + backward's seed
    ("bwd", "conv"): 14.86,         # 18.11, 11.61: ConvolutionBackward0 + AccumulateGrad
    ("bwd", "cast"): 3.75,          # 4.71, 2.79: the cast's ToCopyBackward0
    ("bwd", "bn"): 11.87,           # 15.07, 8.66: CudnnBatchNormBackward0 + 2 AccumulateGrad
    ("bwd", "relu"): 2.96,          # 3.79, 2.14
    ("bwd", "add"): 1.08,           # 1.31, 0.85: AddBackward0 (no launch)
    ("bwd", "maxpool"): 6.89,       # 8.71, 5.07
    ("bwd", "avgpool"): 19.36,      # 18.94, 19.77: AsStrided/Mean/View backward
    ("bwd", "fc"): 125.06,          # 123.97, 126.15: the loss's 12 nodes + AddmmBackward0
    ("update", "grad_scaler"): 59.37,   # 47.97, 70.77: its ops before and after the step
    ("update", "zero_grad"): 227.05,    # 281.20, 172.89: 161 zero_ launches
}


def layer_host_s(pss: str, kind: str, kernels: int, unit_s: float,
                 autocast: bool = False) -> float:
    """An op's host time beyond its ``kernels`` launches: ``max(units − kernels, 0) · unit_s``
    (:data:`HOST_UNITS`; a convolution under autocast adds its cast's units; 0 for an op the
    table has no figure for).

    Parameters
    ----------
    pss : str
        ``fwd``, ``bwd`` or ``update``.
    kind : str
        the layer's kind (``conv``, ``bn``, ``relu``, ``add``, ``maxpool``, ``avgpool``,
        ``fc``) or the update op (``grad_scaler``, ``zero_grad``).
    kernels : int
        the kernels ddlsim launches for the op (each already charged ``h``).
    unit_s : float
        :func:`~ddlsim.simulator.kernels.host.eager_unit_s`.
    autocast : bool
        the run casts each convolution's weight (fp16/bf16 autocast): its cast's units too.

    Returns
    -------
    float
        ``host_s`` (s).
    """
    units = HOST_UNITS.get((pss, kind))
    if units is None:
        return 0.0
    if autocast and kind == "conv":
        units += HOST_UNITS[(pss, "cast")]
    return max(units - kernels, 0.0) * unit_s


def issued_by_host(ops: tuple[Op, ...], host_s: Mapping[str, float]) -> tuple[Op, ...]:
    """``ops`` (one block) with the host's work laid on the ``host`` stream
    (:func:`~ddlsim.workloads.hoststream.lay_host_ops`): before each compute op named in
    ``host_s``, a host op of that many seconds (its launches included), which it waits for."""
    return tuple(lay_host_ops(ops, lambda payload: host_s.get(payload.name))[0])
