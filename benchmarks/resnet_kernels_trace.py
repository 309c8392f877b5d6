"""ResNet-50's device kernels, measured one by one, beside ddlsim's (issue 29, cause 2: the
held-out "ResNet-50 with PyTorch DDP on A100: 34 % too fast"; the device-bound rows of
``benchmarks/validate_device_h200.py``).

Run:  python benchmarks/resnet_kernels_trace.py [--layers] [TRACE.json.gz VARIANT]

Default: ``benchmarks/data/device_h200_2026-11-30/run4/resnet/resnet_amp_nhwc_256_trace.json.gz``
(``benchmarks/device/resnet_step.py --trace`` on one H200 SXM, torch 2.11.0+cu130, cuDNN 9.19:
one training step of torchvision's ResNet-50, AMP fp16 under autocast with a GradScaler,
channels-last, batch 256, SGD, gradients zeroed in place), against ddlsim's trace of the same
row (``validate_device_h200.config`` of ``amp_nhwc_256``), each ddlsim kernel timed by
:func:`ddlsim.simulator.kernels.device.kernel_time` on the row's system.

**Which op launched a kernel.** Each device event (kernel, memset, copy) names the runtime call
that launched it (``args.correlation``); that call sits inside host events on its thread: the
outermost one is its *root* (a forward module op on the main thread, ``aten::conv2d``; an
autograd node on the engine's thread, ``evaluate_function: ConvolutionBackward0``; the update's
``Optimizer.step``, ...), the innermost its aten op. A node's ``Sequence number`` is the one of
the forward op that made it, so every backward kernel is tied to its forward layer; forward
roots are matched to ddlsim's layers of the same kind in forward order (torchvision's order:
a bottleneck's ``conv1 … bn3``, then ``downsample``).

**Classes** (:data:`CLASSES`; ``cuDNN``'s and cuBLAS's kernel names for the convolutions):

* a convolution's forward (``conv_fprop``), data gradient (``conv_dgrad``) and weight gradient
  (``conv_wgrad``): cuDNN's ``sm90_xmma_{fprop,dgrad,wgrad}`` kernels by their names, cuBLASLt's
  ``nvjet`` GEMMs (cuDNN runs some 1×1 convolutions through them) by their order in
  ``ConvolutionBackward0`` (PyTorch's ``cudnn_convolution_backward`` computes the input
  gradient before the weight gradient, ``aten/src/ATen/native/cudnn/ConvShared.cpp``); a
  split-K weight gradient's workspace initialisation and reduction kernels are its own;
* ``conv_pad``: cuDNN's ``nhwcAddPaddingKernel`` (the image's, then the filter's) and the
  memset just before the image's, which zeroes the padded copy (the first layer's 3-channel
  image padded to the 4 channels of its ``c4`` kernels);
* ``cast``: autocast's fp32 → fp16 weight casts in ``aten::conv2d``/``aten::linear``;
  ``input_cast``: the image's cast in the first convolution (the largest cast of ``conv1``);
  ``cast_bwd``: ``ToCopyBackward0``, the 16-bit weight gradient back to fp32;
* ``bn_fwd``, ``bn_bwd`` (cuDNN's ``batchnorm_{fw,bw}tr_nhwc_semiPersist``), ``bn_counter``
  (``num_batches_tracked.add_(1)``), ``relu_fwd`` (``clamp_min_``), ``relu_bwd``
  (``threshold_backward``), ``add_fwd`` (the residual add), ``add_bwd`` (the sum of the two
  gradients where a block's input forked: autograd's input buffer, inside the node that
  delivered the second), ``maxpool_*``, ``avgpool_*``, ``fc_*`` (cuBLAS), ``loss_*``
  (cross-entropy with label smoothing), ``accumulate`` (``AccumulateGrad`` into the zeroed
  ``.grad``), ``grad_scaler``, ``sgd``, ``zero_grad``;
* ``memset``: cuDNN's small memsets before its kernels (ddlsim lists none).

**ddlsim's classes.** Each op of ddlsim's trace is one layer and pass; its kernels are labelled
by the functions that make them (``ddlsim/workloads/resnet/kernels.py``, ``step.py``): a
convolution's GEMMs (forward; data gradient, then weight gradient), its autocast cast, its
``AccumulateGrad`` adds; a point-wise layer's passes.

Printed: per class, measured and ddlsim's kernels and device milliseconds; the achieved rate
of ddlsim's kernel classes (:func:`class_rates`: ddlsim's bytes of the class over the measured
kernels' time, a fraction of the datasheet bandwidth: the figure a device's
``elementwise_efficiency`` would take); with ``--layers``, per convolution, its GEMM shape,
measured and ddlsim microseconds and achieved TFLOP/s of each GEMM (forward, data, weight
gradient) and the measured kernels' library. Nothing is fitted to the step time: the figures
are the trace's own kernel durations.

**What it found** (2026-11-30, amp_nhwc_256): 42.07 ms of device events against ddlsim's
35.6 ms. The convolutions are not the gap: their 217 kernels ran 13.75 ms, ddlsim's GEMMs by
shape 14.18 (per kernel within about ±30 %; the stem's 4-channel ``image_first_layer`` HMMA
kernels at 150 TFLOP/s, 0.80 ms against 0.52; strided data gradients slower, 1×1
convolutions of 64 channels faster than the shape model). The gap is in memory kernels that
run below the streaming rate ddlsim gives them: cuDNN's persistent NHWC batch norm (5.69 ms
forward, 8.07 backward, against 3.95 and 6.59: 0.625 and 0.734 of 4.8 TB/s over ddlsim's
3 and 5 passes) and PyTorch's NHWC max pooling (0.83 ms forward, 1.83 the backward's gather,
against 0.21 each); then ~0.9 ms of kernels of a microsecond or two that ddlsim times
at their bytes (casts, ``AccumulateGrad``, ``zero_()``, the counter adds, the loss, cuDNN's
207 memsets, which it does not list), and the stem's padding (0.29 ms, 0.13 as streamed).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

RUN4 = Path(__file__).parent / "data" / "device_h200_2026-11-30" / "run4" / "resnet"
TRACE = RUN4 / "resnet_amp_nhwc_256_trace.json.gz"
VARIANT = "amp_nhwc_256"
_NODE = "autograd::engine::evaluate_function: "
_HOST = frozenset({"cpu_op", "user_annotation"})
_LAUNCH = frozenset({"cuda_runtime", "cuda_driver"})
_DEVICE = frozenset({"kernel", "gpu_memset", "gpu_memcpy"})
#: forward root → layer kind; backward node → layer kind (or the class of its kernels)
_FORWARD = {"aten::conv2d": "conv", "aten::batch_norm": "bn", "aten::relu_": "relu",
            "aten::add_": "add", "aten::max_pool2d": "maxpool",
            "aten::adaptive_avg_pool2d": "avgpool", "aten::linear": "fc"}
_BACKWARD = {"ConvolutionBackward0": "conv", "CudnnBatchNormBackward0": "bn",
             "ReluBackward0": "relu", "MaxPool2DWithIndicesBackward0": "maxpool",
             "MeanBackward1": "avgpool", "AsStridedBackward1": "avgpool",
             "AddmmBackward0": "fc", "ToCopyBackward0": "cast_bwd",
             "torch::autograd::AccumulateGrad": "accumulate"}
#: the GradScaler's roots (``scale``, ``unscale_``, ``update``) on the main thread
_SCALER = frozenset({"aten::mul", "aten::_amp_foreach_non_finite_check_and_unscale_",
                     "aten::_amp_update_scale_", "aten::item", "aten::full",
                     "aten::reciprocal"})
#: the classes, in print order
CLASSES = ("conv_fprop", "conv_dgrad", "conv_wgrad", "conv_pad", "memset", "cast", "input_cast",
           "cast_bwd", "bn_fwd", "bn_bwd", "bn_counter", "relu_fwd", "relu_bwd", "add_fwd",
           "add_bwd", "maxpool_fwd", "maxpool_bwd", "avgpool_fwd", "avgpool_bwd", "fc_fwd",
           "fc_dgrad", "fc_wgrad", "loss_fwd", "loss_bwd", "accumulate", "grad_scaler", "sgd",
           "zero_grad")


@dataclass(frozen=True)
class DeviceKernel:
    """One measured device event: its name, seconds, class and the layer it belongs to."""

    name: str
    seconds: float
    cls: str
    layer: str | None


def _launch_sites(events: list[dict]) -> dict[int, tuple[dict, dict, tuple[int, ...]]]:
    """Per launch correlation id, ``(root, innermost, sequence numbers)``: the host events
    around the launching call on its thread (nested by time, as the profiler records them) and
    the autograd sequence numbers those events carry."""
    by_tid: dict = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and (e.get("cat") in _HOST or e.get("cat") in _LAUNCH):
            by_tid[e["tid"]].append(e)
    out: dict[int, tuple[dict, dict, tuple[int, ...]]] = {}
    for evs in by_tid.values():
        stack: list[dict] = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if e["cat"] in _LAUNCH:
                corr = e.get("args", {}).get("correlation")
                if corr is not None and stack:
                    seqs = tuple(s for s in map(_seq, stack) if s is not None)
                    out[corr] = (stack[0], stack[-1], seqs)
            else:
                stack.append(e)
    return out


def read_trace(path: Path) -> list[tuple[dict, dict, dict, tuple[int, ...]]]:
    """The device events of a Kineto trace in time order, each as ``(event, root, op, seqs)``:
    the host root and innermost host op that launched it and the autograd sequence numbers
    around the launch (:func:`_launch_sites`)."""
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    sites = _launch_sites(events)
    out = []
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in _DEVICE),
                    key=lambda e: e["ts"]):
        site = sites.get(e.get("args", {}).get("correlation"))
        if site is None:
            raise ValueError(f"{path}: device event {e['name'][:60]!r} at {e['ts']} has no "
                             "launching host op")
        out.append((e, *site))
    return out


def _seq(e: dict) -> int | None:
    return e.get("args", {}).get("Sequence number")


def _is_gemm(name: str) -> bool:
    """A convolution's or matmul's main kernel (cuDNN's xmma, cuBLASLt's nvjet)."""
    return name.startswith(("sm90_xmma", "sm80_xmma", "nvjet", "ampere_", "cutlass"))


def _forward_layers(layers) -> dict[str, list[str]]:
    """ddlsim's layer names per kind in forward order."""
    out: dict[str, list[str]] = defaultdict(list)
    for layer in layers:
        out[layer.kind].append(layer.name)
    return out


def classify(trace: list[tuple[dict, dict, dict, tuple[int, ...]]], layers
             ) -> list[DeviceKernel]:
    """Each device event's class and layer (module docstring); ``layers``: ddlsim's
    (``cfg.model.layers``), whose forward order the trace's forward roots follow."""
    names = _forward_layers(layers)
    seen: dict[str, int] = defaultdict(int)
    layer_of_seq: dict[int, str] = {}
    root_layer: dict[int, str | None] = {}      # id(root) -> layer
    out: list[DeviceKernel] = []
    gemms: dict[int, int] = defaultdict(int)
    padded: set[int] = set()                    # roots whose image pad has been met
    first_conv = names["conv"][0]
    for e, root, op, seqs in trace:
        if id(root) not in root_layer:
            root_layer[id(root)] = _root_layer(root, e, names, seen, layer_of_seq)
        layer = root_layer[id(root)]
        if not root["name"].startswith(_NODE) and layer is not None:
            layer_of_seq.update(dict.fromkeys(seqs, layer))
        cls = _class(e, root, op, layer, first_conv, gemms)
        if cls == "conv_pad" and id(root) not in padded:
            padded.add(id(root))                # the root's first pad is the image's: the
            if out and out[-1].cls == "memset":     # memset just before it zeroes its copy
                out[-1] = DeviceKernel(out[-1].name, out[-1].seconds, "conv_pad", layer)
        out.append(DeviceKernel(e["name"], e["dur"] * 1e-6, cls, layer))
    return _input_cast(out, first_conv)


def _bn_counter(root: dict, e: dict) -> bool:
    """``num_batches_tracked.add_(1)``: an ``aten::add_`` root whose kernel adds to an int64."""
    return root["name"] == "aten::add_" and "_add<long>" in e["name"]


def _root_layer(root: dict, e: dict, names, seen, layer_of_seq) -> str | None:
    """The ddlsim layer a root belongs to (``e``: its first device event): forward roots in
    order of their kind, backward nodes through the sequence numbers of their forward op."""
    rname = root["name"]
    kind = _FORWARD.get(rname)
    if _bn_counter(root, e):
        return None
    if kind is not None:
        at = seen[kind]
        seen[kind] += 1
        return names[kind][at] if at < len(names[kind]) else None
    if rname.startswith(_NODE):
        return layer_of_seq.get(_seq(root))
    return None


def _class(e: dict, root: dict, op: dict, layer: str | None, first_conv: str,
           gemms: dict[int, int]) -> str:
    """The class of one device event (module docstring); ``gemms`` counts the GEMMs met so
    far per backward node (the data gradient's come first)."""
    rname, oname = root["name"], op["name"]
    node = rname.removeprefix(_NODE) if rname.startswith(_NODE) else None
    if rname == "aten::conv2d" or node == "ConvolutionBackward0":
        return _conv_event(e, root, oname, layer, first_conv, gemms)
    if e["cat"] == "gpu_memset":
        return "memset"
    if node is not None:
        kind = _BACKWARD.get(node)
        if oname == "aten::add_" and kind != "accumulate":
            return "add_bwd"            # the input buffer's sum of two gradients
        if kind in ("cast_bwd", "accumulate"):
            return kind
        if kind == "fc":                # addmm's backward: mat1's gradient, then mat2's
            if oname == "aten::mm":
                gemms[id(root)] += 1
                return "fc_dgrad" if gemms[id(root)] == 1 else "fc_wgrad"
            return "fc_wgrad"           # the bias gradient's sum
        return f"{kind}_bwd" if kind is not None else "loss_bwd"
    kind = _FORWARD.get(rname)
    if _bn_counter(root, e):
        return "bn_counter"
    if kind == "fc" and oname == "aten::copy_":
        return "cast"
    if kind is not None:
        return f"{kind}_fwd"
    if rname.startswith("Optimizer.step"):
        return "sgd"
    if rname.startswith("Optimizer.zero_grad"):
        return "zero_grad"
    return "grad_scaler" if rname in _SCALER else "loss_fwd"


def _conv_event(e: dict, root: dict, oname: str, layer: str | None, first_conv: str,
                gemms: dict[int, int]) -> str:
    """The class of a device event of a convolution's forward root or backward node."""
    name, memset = e["name"], e["cat"] == "gpu_memset"
    if "AddPadding" in name:
        return "conv_pad"
    if memset:
        return "memset"
    if oname == "aten::copy_" and root["name"] == "aten::conv2d":
        return "cast"
    if oname == "aten::add_":
        return "add_bwd"                # the input buffer's sum, delivered by this node
    if root["name"] == "aten::conv2d":
        return "conv_fprop"
    if _is_gemm(name):
        gemms[id(root)] += 1            # a main kernel, named or not
    for pss in ("dgrad", "wgrad"):
        if f"_{pss}_" in name:
            return f"conv_{pss}"
    if not _is_gemm(name):
        return "conv_wgrad"             # a weight gradient's workspace or split-K reduction
    return "conv_dgrad" if layer != first_conv and gemms[id(root)] == 1 else "conv_wgrad"


def _input_cast(kernels: list[DeviceKernel], first_conv: str) -> list[DeviceKernel]:
    """The first convolution's largest cast is the image's (the weight's is 9,408 elements)."""
    casts = [i for i, k in enumerate(kernels) if k.cls == "cast" and k.layer == first_conv]
    if len(casts) < 2:
        return kernels
    big = max(casts, key=lambda i: kernels[i].seconds)
    k = kernels[big]
    return kernels[:big] + [DeviceKernel(k.name, k.seconds, "input_cast", k.layer)] \
        + kernels[big + 1:]


# --- ddlsim's side --------------------------------------------------------------------------

def ddlsim_config(variant: str = VARIANT):
    """The loaded run config of ``validate_device_h200``'s row ``variant``."""
    import ddlsim
    import validate_device_h200 as v
    row = next(r for r in v.resnet_rows() if r["variant"] == variant)
    return ddlsim.load_config(v.config(row))


@dataclass(frozen=True)
class ModelKernel:
    """One of ddlsim's kernels: its class, layer, seconds and, for a GEMM, its shape."""

    cls: str
    layer: str | None
    seconds: float
    shape: tuple[float, float, float] | None = None
    bytes: float = 0.0
    variant: str = ""


def ddlsim_kernels(cfg) -> list[ModelKernel]:
    """ddlsim's kernels of ``cfg``'s step, each timed by ``kernel_time`` and labelled with the
    class its maker gives it (module docstring)."""
    import ddlsim
    from ddlsim.simulator.kernels.device import kernel_device, kernel_time
    dev = kernel_device(cfg.system)
    layers = {layer.name: layer for layer in cfg.model.layers}
    first = next(layer.name for layer in cfg.model.layers if layer.gemm)
    program = ddlsim.build_workload(cfg).classes[0].program
    out: list[ModelKernel] = []
    for block in ("F", "B.sync", "update"):
        for op in program.blocks[block].ops:
            kernels = getattr(op.payload, "kernels", None)
            if not kernels:
                continue
            pss, _, name = op.payload.name.partition(".")
            labels = _labels(pss, layers.get(name), op.payload.name, len(kernels), cfg,
                             name == first)
            out += [ModelKernel(cls, name if name in layers else None, kernel_time(k, dev),
                                k.shape if k.kind == "gemm" else None, k.bytes, k.variant)
                    for cls, k in zip(labels, kernels)]
    return out


def _labels(pss: str, layer, op_name: str, n: int, cfg, first: bool) -> list[str]:
    """The class of each kernel of one ddlsim op, in order, from the functions that make
    them (``ddlsim/workloads/resnet/kernels.py``; ``n``: the op's kernels)."""
    from ddlsim.workloads.resnet.kernels import (autocast_casts, conv_kernels,
                                                 pointwise_kernels, stem_kernels)
    if layer is None:
        kind = {"grad_scaler": "grad_scaler", "optimizer": "sgd", "zero_grad": "zero_grad"}
        return [kind.get(op_name, "accumulate" if op_name.endswith("accumulate") else op_name)] * n
    bwd, mb, dtype = pss == "bwd", cfg.train.micro_batch_size, cfg.train.dtype
    nhwc = cfg.model.memory_format == "channels_last"
    if not layer.gemm:
        own = [f"{layer.kind}_{pss}"] * len(pointwise_kernels(layer, mb, dtype, bwd, nhwc))
        return own + ["accumulate"] * (n - len(own))
    prefix = "conv" if layer.kind == "conv" else "fc"
    gemm = iter([f"{prefix}_fprop" if prefix == "conv" else "fc_fwd"] if not bwd else
                ([] if first else [f"{prefix}_dgrad"]) + [f"{prefix}_wgrad"])
    stem = stem_kernels(layer, mb, dtype, bwd, nhwc)
    cast = 1 if stem and not bwd and dtype in ("fp16", "bf16") else 0
    own = ["input_cast"] * cast + ["conv_pad"] * (len(stem) - cast)
    own += [next(gemm) if k.kind == "gemm" else "nchw_transpose"
            for k in conv_kernels(layer, mb, dtype, bwd, nhwc, not first)]
    own += ["cast_bwd" if bwd else "cast"] * len(autocast_casts(layer, dtype, bwd))
    return own + ["accumulate"] * (n - len(own))


# --- tables ---------------------------------------------------------------------------------

def class_totals(measured: list[DeviceKernel], model: list[ModelKernel]) -> dict[str, dict]:
    """Per class: ``n`` and ``ms`` measured, ``n_ddlsim`` and ``ms_ddlsim``."""
    out: dict[str, dict] = {}
    for k in measured:
        c = out.setdefault(k.cls, {"n": 0, "ms": 0.0, "n_ddlsim": 0, "ms_ddlsim": 0.0})
        c["n"] += 1
        c["ms"] += k.seconds * 1e3
    for k in model:
        c = out.setdefault(k.cls, {"n": 0, "ms": 0.0, "n_ddlsim": 0, "ms_ddlsim": 0.0})
        c["n_ddlsim"] += 1
        c["ms_ddlsim"] += k.seconds * 1e3
    order = {c: i for i, c in enumerate(CLASSES)}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))


def conv_layers(measured: list[DeviceKernel], model: list[ModelKernel], cfg) -> list[dict]:
    """Per convolution, per GEMM pass (``fprop``, ``dgrad``, ``wgrad``): measured and ddlsim
    seconds (a weight gradient's workspace and split-K kernels included), FLOPs, the GEMM
    shape and the measured main kernels' names."""
    meas: dict = defaultdict(lambda: {"s": 0.0, "names": []})
    for k in measured:
        if k.cls.startswith("conv_") and k.cls != "conv_pad":
            m = meas[(k.layer, k.cls.removeprefix("conv_"))]
            m["s"] += k.seconds
            if _is_gemm(k.name):
                m["names"].append(k.name)
    mod: dict = {}
    for k in model:
        if k.cls.startswith("conv_") and k.cls != "conv_pad":
            mod[(k.layer, k.cls.removeprefix("conv_"))] = (k.seconds, k.shape)
    rows = []
    for layer in cfg.model.layers:
        if layer.kind != "conv":
            continue
        for pss in ("fprop", "dgrad", "wgrad"):
            if (layer.name, pss) not in mod:
                continue
            s, shape = mod[(layer.name, pss)]
            m = meas.get((layer.name, pss), {"s": 0.0, "names": []})
            rows.append({"layer": layer.name, "pass": pss, "geometry": layer.geometry,
                         "shape": shape, "flops": 2.0 * shape[0] * shape[1] * shape[2],
                         "measured_s": m["s"], "ddlsim_s": s, "kernels": m["names"]})
    return rows


#: the measured kernels of each class ``kernels.NHWC_CLASSES`` and ``NCHW_CLASSES`` name (their
#: kernel names)
CLASS_KERNELS = {"batchnorm": "batchnorm_fwtr_nhwc", "batchnorm_backward": "batchnorm_bwtr_nhwc",
                 "maxpool": "max_pool_forward_nhwc", "maxpool_backward": "max_pool_backward_nhwc",
                 "batchnorm_nchw": "bn_fw_tr_1C11", "batchnorm_nchw_backward": "bn_bw_1C11",
                 "maxpool_nchw": "max_pool_forward_nchw",
                 "maxpool_nchw_backward": "max_pool_backward_nchw"}


def class_rates(measured: list[DeviceKernel], model: list[ModelKernel],
                datasheet_Bps: float) -> dict[str, dict]:
    """Per kernel class of ddlsim's (``Kernel.variant``): its kernels' bytes as ddlsim counts
    them, the measured kernels' seconds (:data:`CLASS_KERNELS`), the achieved B/s and its
    fraction of ``datasheet_Bps``: the figure ``device.elementwise_efficiency[class]`` takes."""
    out = {}
    for cls, kernel in CLASS_KERNELS.items():
        nbytes = sum(k.bytes for k in model if k.variant == cls)
        s = sum(k.seconds for k in measured if kernel in k.name)
        if nbytes and s:
            out[cls] = {"bytes": nbytes, "seconds": s, "Bps": nbytes / s,
                        "fraction": nbytes / s / datasheet_Bps,
                        "kernels": sum(kernel in k.name for k in measured)}
    return out


def _library(names: list[str]) -> str:
    return "+".join(sorted({"cuBLAS" if n.startswith("nvjet") else "cuDNN" for n in names}))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    layers_table = "--layers" in argv
    argv = [a for a in argv if a != "--layers"]
    path, variant = (Path(argv[0]), argv[1]) if len(argv) >= 2 else (TRACE, VARIANT)
    cfg = ddlsim_config(variant)
    measured = classify(read_trace(path), cfg.model.layers)
    model = ddlsim_kernels(cfg)
    print(f"{path.name} against ddlsim's {variant} on {cfg.system.name}: device kernels per class")
    print(f"{'class':13} {'n meas':>6} {'ms meas':>8} | {'n ddlsim':>8} {'ms ddlsim':>9} | "
          f"{'ddlsim - meas':>13}")
    for cls, c in class_totals(measured, model).items():
        print(f"{cls:13} {c['n']:6d} {c['ms']:8.3f} | {c['n_ddlsim']:8d} {c['ms_ddlsim']:9.3f}"
              f" | {c['ms_ddlsim'] - c['ms']:+13.3f}")
    tm, td = sum(k.seconds for k in measured), sum(k.seconds for k in model)
    print(f"{'total':13} {len(measured):6d} {tm * 1e3:8.3f} | {len(model):8d} {td * 1e3:9.3f}"
          f" | {(td - tm) * 1e3:+13.3f}")
    datasheet = cfg.system.device.memory_bandwidth_Bps
    print(f"\nkernel classes: ddlsim's bytes over the measured kernels' time, / "
          f"{datasheet / 1e12:.2f} TB/s datasheet")
    for cls, c in class_rates(measured, model, datasheet).items():
        print(f"{cls:19} {c['kernels']:3d} kernels {c['bytes'] / 1e9:7.3f} GB "
              f"{c['seconds'] * 1e3:7.3f} ms {c['Bps'] / 1e12:6.3f} TB/s = {c['fraction']:.3f}")
    if layers_table:
        print("\nper convolution GEMM: C K R H_out, GEMM (M, N, K), us and TFLOP/s")
        for r in conv_layers(measured, model, cfg):
            c, k, rr, p = r["geometry"]
            m, d = r["measured_s"], r["ddlsim_s"]
            tf = (lambda s: r["flops"] / s / 1e12 if s else 0.0)
            print(f"{r['layer']:22} {r['pass']:5} {c:5d} {k:5d} {rr} {p:3d} "
                  f"({r['shape'][0]:9.0f} {r['shape'][1]:5.0f} {r['shape'][2]:7.0f}) "
                  f"meas {m * 1e6:7.1f} us {tf(m):6.1f} TF | ddlsim {d * 1e6:7.1f} us "
                  f"{tf(d):6.1f} TF | {_library(r['kernels'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
