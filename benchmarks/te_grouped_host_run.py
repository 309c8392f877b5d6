"""The run side of benchmarks/te_grouped_host.py: Transformer Engine's own ``GroupedLinear`` Python
(``transformer_engine/pytorch/module/grouped_linear.py`` and what it calls: ``base.py``,
``cpp_extensions/gemm.py``, ``utils.py``, ``quantization.py``) run on CPU with its compiled
extension and its CUDA calls replaced by stand-ins, Megatron-Core's DDP gradient hook (its own
code) on every expert weight; the experts' fc1 and fc2 as ``TEGroupedMLP`` runs them in BF16.
Needs torch, a Transformer Engine source tree and a Megatron-LM source tree; imports none of them
at module level. What is stood in for, and how each stand-in is counted:
benchmarks/data/te_grouped_host/README.md.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import time
import types
from pathlib import Path

#: ``tex.get_num_cublas_streams()``: TransformerEngine v2.9 ``common/util/multi_stream.cpp``
#: line 53 (``num_compute_streams = 4``), read once for the cached workspaces
NUM_CUBLAS_STREAMS = 4
#: ``get_sm_count()`` (cached once): an H100 SXM's 132 SMs (NVIDIA H100 datasheet); it only
#: sets the GEMM's SM margin argument, which the stand-in ignores
SM_COUNT = 132
#: the tiny expert shape: hidden, expert FFN (fc1 is hidden -> 2 FFN, gated, as Qwen3's experts)
HIDDEN, FFN = 64, 32


class Opaque:
    """A name of the compiled extension read at import time (enums, classes): comparable,
    hashable, never called (a call raises, naming the missing stand-in)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> "Opaque":
        if name.startswith("__"):
            raise AttributeError(name)
        return Opaque(f"{self._path}.{name}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"te_grouped_host: {self._path} was called and has no stand-in")

    def __repr__(self) -> str:
        return self._path

    def __hash__(self) -> int:
        return hash(self._path)

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and other._path == self._path


class Tally:
    """Per pass: the stand-ins' calls (as the GPU calls they stand for), the thread CPU ns
    spent inside the GEMM stand-in (taken out of the pass: on a GPU the extension's C++ issues
    the GEMMs, which ddlsim times per GEMM) and inside ``_GroupedLinear``'s ``forward`` and
    ``backward`` bodies (``body_ns``, the GEMM stand-in's taken out)."""

    def __init__(self) -> None:
        self.gpu, self.body_ns, self.gemm_ns = collections.Counter(), collections.Counter(), 0
        self.standin = False        # inside a stand-in: its own torch calls are not counted
        self.mode = None            # counting: a TorchFunctionMode entered in the backward

    def note(self, name: str) -> None:
        """One call of the GPU path that a stand-in replaced."""
        self.gpu[name] += 1

    def take(self) -> tuple[dict, int, dict]:
        """The counts, the GEMM ns and the bodies' ns so far; all start again."""
        out = (dict(self.gpu), self.gemm_ns, dict(self.body_ns))
        self.gpu, self.body_ns, self.gemm_ns = collections.Counter(), collections.Counter(), 0
        return out

    def timed_body(self, fn, key: str):
        """``fn`` (a staticmethod's function) with its thread CPU ns, less the GEMM stand-in's
        inside it, added to ``body_ns[key]``."""
        def body(*a, **k):
            t0, g0 = time.thread_time_ns(), self.gemm_ns
            try:
                if self.mode is None:
                    return fn(*a, **k)
                with self.mode():        # autograd does not carry the mode into backward
                    return fn(*a, **k)
            finally:
                self.body_ns[key] += time.thread_time_ns() - t0 - (self.gemm_ns - g0)
        return staticmethod(body)


def _package(name: str, root: Path) -> None:
    """A package whose ``__init__`` is not run (it loads the compiled libraries)."""
    mod = types.ModuleType(name)
    mod.__path__ = [str(root / name.replace(".", "/"))]
    sys.modules[name] = mod


def _stub(name: str, *attrs: str) -> None:
    """A module that imports what this CPU lacks (onnxscript, triton), never used here."""
    mod = types.ModuleType(name)
    for attr in attrs:
        setattr(mod, attr, Opaque(f"{name}.{attr}"))
    sys.modules[name] = mod


def grouped_gemm(torch, tally: Tally):
    """``tex.te_general_grouped_gemm`` on CPU: per GEMM ``D = op(B) · op(A)`` (TE's layouts,
    ``csrc/extensions/gemm.cpp`` lines 393-560: ``TN`` fprop, ``NN`` dgrad, ``NT`` wgrad), one
    output split by ``m_splits`` when ``single_output``, added into ``D`` when ``accumulate``
    (``main_grad``); its thread CPU time goes to ``tally.gemm_ns``."""
    def gemm(A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output,
             pre_gelu_out, grad, workspace, workspace_size, accumulate, split_acc, sm_margin):
        t0 = time.thread_time_ns()
        tally.note("tex.te_general_grouped_gemm")
        tally.standin = True
        outs = torch.split(D[0], list(m_splits)) if single_output else D
        for a, b, d in zip(A, B, outs):
            r = (b.t() if transb else b).float() @ (a.t() if transa else a).float()
            d.add_(r) if accumulate else d.copy_(r)
        tally.standin = False
        tally.gemm_ns += time.thread_time_ns() - t0
        return bias
    return gemm


def _cuda_stand_ins(torch, tally: Tally) -> None:
    """The CUDA calls of GroupedLinear's BF16 path, each counted as the call it stands for."""
    def current_device():
        tally.note("torch.cuda.current_device")
        return "cpu"

    def capturing():
        tally.note("torch.cuda.is_current_stream_capturing")
        return False

    class Device:       # torch.cuda.device: _exchange_device on enter and exit
        def __init__(self, device):
            tally.note("torch.cuda.device")

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    class Range:        # torch.cuda.nvtx.range: range_push on enter, range_pop on exit
        def __init__(self, msg, *a, **k):
            tally.note("torch.cuda.nvtx.range")

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    torch.cuda.current_device = current_device
    torch.cuda.is_current_stream_capturing = capturing
    torch.cuda.device = Device
    torch.cuda.nvtx.range = Range
    torch.Tensor.is_cuda = property(lambda self: True)   # prepare_forward's assert


def load(te_root: Path, megatron_root: Path, torch, tally: Tally) -> tuple:
    """Import TE's ``grouped_linear`` and Megatron's DDP hook code with the stand-ins in place;
    returns (``GroupedLinear``, ``DistributedDataParallel``, ``_ParamAndGradBucketGroup``)."""
    from packaging.version import Version

    for name in ("megatron", "megatron.core", "megatron.core.distributed"):
        _package(name, megatron_root)       # first: Megatron's TE checks find no TE
    from megatron.core.distributed import distributed_data_parallel as ddp
    from megatron.core.distributed import param_and_grad_buffer as pgb
    tex = types.ModuleType("transformer_engine_torch")
    tex.__getattr__ = Opaque("tex").__getattr__
    tex.te_general_grouped_gemm = grouped_gemm(torch, tally)
    tex.get_num_cublas_streams = lambda: NUM_CUBLAS_STREAMS
    sys.modules["transformer_engine_torch"] = tex
    for name in ("transformer_engine", "transformer_engine.common", "transformer_engine.pytorch"):
        _package(name, te_root)
    sys.modules["transformer_engine.pytorch"].torch_version = functools.lru_cache(None)(
        lambda: Version(str(torch.__version__)).release)
    _stub("transformer_engine.pytorch.onnx_extensions", "torch_onnx_gemm_inf_op",
          "onnx_quantize_fp8_op", "onnx_dequantize_fp8_op", "onnx_quantize_mxfp8_op",
          "onnx_dequantize_mxfp8_op", "onnx_layernorm", "onnx_attention_mask_func", "onnx_gemm",
          "te_translation_table")
    _stub("transformer_engine.pytorch.triton.pad", "pad_columnwise_scale_inv")
    _cuda_stand_ins(torch, tally)
    from transformer_engine.pytorch.module import base, grouped_linear
    from transformer_engine.pytorch import utils
    _prime(torch, base, utils)
    fn = grouped_linear._GroupedLinear
    fn.forward = tally.timed_body(fn.forward, "fwd")
    fn.backward = tally.timed_body(fn.backward, "bwd")
    return grouped_linear.GroupedLinear, ddp.DistributedDataParallel, pgb._ParamAndGradBucketGroup


def _prime(torch, base, utils) -> None:
    """TE's once-per-process cached CUDA objects, made on CPU before any pass: the empty tensor
    (``utils._empty_tensor``), the SM count and the multi-stream cuBLAS workspaces."""
    real_cuda, real_props = torch.Tensor.cuda, torch.cuda.get_device_properties
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(
        multi_processor_count=SM_COUNT, major=9)
    try:
        utils._empty_tensor()
        utils.get_sm_count()
        base._multi_stream_cublas_workspace.extend(
            torch.empty(0, dtype=torch.uint8) for _ in range(NUM_CUBLAS_STREAMS))
    finally:
        torch.Tensor.cuda, torch.cuda.get_device_properties = real_cuda, real_props


def experts(torch, GroupedLinear, DDP, BucketGroup, local: int, tally: Tally | None = None,
            timed_hooks: bool = False) -> tuple:
    """fc1 (h -> 2f) and fc2 (f -> h) over ``local`` experts in BF16 with
    ``fuse_wgrad_accumulation``, each weight with an fp32 ``main_grad``, Megatron's
    ``grad_added_to_main_grad`` and Megatron-LM's own backward post-hook
    (``DistributedDataParallel._make_backward_post_hook``, registered on the weight's
    ``AccumulateGrad`` node as its ``__init__`` does; ``overlap_grad_reduce``, not the last
    micro-batch: ``register_grad_ready`` returns after its checks). With ``tally`` each hook
    runs in ``tally.mode`` when one is set (counting), and with ``timed_hooks`` its thread CPU
    ns go to ``tally.body_ns["hook"]``. Returns (fc1, fc2, the hooked nodes)."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True          # TE's construction asserts it
    try:
        mods = [GroupedLinear(local, HIDDEN, 2 * FFN, bias=False, params_dtype=torch.bfloat16,
                              fuse_wgrad_accumulation=True, device="cpu"),
                GroupedLinear(local, FFN, HIDDEN, bias=False, params_dtype=torch.bfloat16,
                              fuse_wgrad_accumulation=True, device="cpu")]
    finally:
        torch.cuda.is_available = real
    params = [p for m in mods for p in m.parameters()]
    group = types.SimpleNamespace(
        ddp_config=types.SimpleNamespace(overlap_grad_reduce=True), is_last_microbatch=False)
    group.register_grad_ready = types.MethodType(BucketGroup.register_grad_ready, group)
    ddp = types.SimpleNamespace(param_to_bucket_group={p: group for p in params},
                                ddp_config=group.ddp_config, force_all_reduce=False)
    keep = []
    for p in params:
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        p.grad_added_to_main_grad = False
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        hook = DDP._make_backward_post_hook(ddp, p)
        acc.register_hook(hook if tally is None else _wrapped(hook, tally, timed_hooks))
        keep.append(acc)
    return mods[0], mods[1], keep


def _wrapped(hook, tally: Tally, timed: bool):
    """``hook`` run inside ``tally.mode`` when one is set (the counting pass's), its thread
    CPU ns added to ``tally.body_ns["hook"]`` when ``timed``."""
    def wrapped(*a):
        t0 = time.thread_time_ns()
        try:
            if tally.mode is None:
                return hook(*a)
            with tally.mode():
                return hook(*a)
        finally:
            if timed:
                tally.body_ns["hook"] += time.thread_time_ns() - t0
    return wrapped


def layer_pass(torch, mods: tuple, tally: Tally, x, probs, splits: list, dy) -> dict:
    """One forward (fc1, the gated activation times the routing probabilities as
    ``TEGroupedMLP.bias_act_func`` runs it unfused, fc2) and its backward: each part's thread
    CPU ns less the GEMM stand-in's (``*_ns``), the stand-in's (``*_gemm_ns``) and the
    stand-ins' calls (``*_gpu``)."""
    fc1, fc2 = mods[:2]
    tally.take()
    t0 = time.thread_time_ns()
    h = fc1(x, splits, is_first_microbatch=False)
    gate, up = torch.chunk(h, 2, dim=-1)
    y = fc2((torch.nn.functional.silu(gate) * up * probs).to(torch.bfloat16), splits,
            is_first_microbatch=False)
    t1 = time.thread_time_ns()
    fwd_gpu, fwd_gemm, fwd_body = tally.take()
    y.backward(dy)
    t2 = time.thread_time_ns()
    bwd_gpu, bwd_gemm, bwd_body = tally.take()
    return {"fwd_ns": t1 - t0 - fwd_gemm, "bwd_ns": t2 - t1 - bwd_gemm, "fwd_gemm_ns": fwd_gemm,
            "bwd_gemm_ns": bwd_gemm, "fwd_body_ns": fwd_body.get("fwd", 0),
            "bwd_body_ns": bwd_body.get("bwd", 0), "hook_ns": bwd_body.get("hook", 0),
            "fwd_gpu": fwd_gpu, "bwd_gpu": bwd_gpu}


def inputs(torch, local: int, tokens: int) -> tuple:
    """The pass's input, routing probabilities, output gradient and ``m_splits`` (a list, as
    Megatron-LM d7288711 ``experts.py`` line 344 passes ``tokens_per_expert.tolist()``)."""
    torch.manual_seed(local * 1000 + tokens)
    m = local * tokens
    return (torch.randn(m, HIDDEN, dtype=torch.bfloat16, requires_grad=True),
            torch.rand(m, 1, dtype=torch.float32), [tokens] * local,
            torch.randn(m, HIDDEN, dtype=torch.bfloat16))


def timed(torch, mods: tuple, tally: Tally, local: int, tokens: int, passes: int,
          warmup: int) -> dict:
    """Median thread CPU µs per pass of the forward and the backward at ``tokens`` tokens per
    expert (the GEMM stand-in's time taken out), over ``passes`` passes after ``warmup``."""
    x, probs, splits, dy = inputs(torch, local, tokens)
    runs = [layer_pass(torch, mods, tally, x, probs, splits, dy)
            for _ in range(warmup + passes)][warmup:]
    med = {k[:-3] + "_us": statistics.median(r[k] for r in runs) / 1e3
           for k in ("fwd_ns", "bwd_ns", "fwd_gemm_ns", "bwd_gemm_ns", "fwd_body_ns",
                     "bwd_body_ns", "hook_ns")}
    return {**med,
            "fwd_gpu": runs[-1]["fwd_gpu"], "bwd_gpu": runs[-1]["bwd_gpu"],
            "gpu_same": all(r["fwd_gpu"] == runs[0]["fwd_gpu"] and
                            r["bwd_gpu"] == runs[0]["bwd_gpu"] for r in runs)}


def _caller(torch_dir: str) -> str:
    """``file:line`` of the first frame outside torch and this module's counting mode."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(torch_dir):
        f = f.f_back
    return "?" if f is None else f"{Path(f.f_code.co_filename).name}:{f.f_lineno}"


def counted(torch, mods: tuple, tally: Tally, local: int, tokens: int) -> dict:
    """One forward and backward (after one uncounted; ``mods`` built with ``tally``), counting
    the calls into torch by the place that made them: ``calls`` (torch functions and tensor methods through a
    ``TorchFunctionMode``, plus each ``autograd.Function.apply``), ``attrs`` (tensor attribute
    reads and writes, e.g. ``param.grad``), the stand-ins' calls (``gpu``), per pass part."""
    from torch.overrides import TorchFunctionMode

    torch_dir = str(Path(torch.__file__).parent)
    seen = {"calls": collections.Counter(), "attrs": collections.Counter()}
    depth = [0]         # calls made inside a counted call are its own, not counted again

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            if not tally.standin and not depth[0]:
                name = getattr(func, "__qualname__", None) or getattr(func, "__name__", "?")
                kind = "attrs" if name.endswith((".__get__", ".__set__")) else "calls"
                seen[kind][f"{_caller(torch_dir)} {name}"] += 1
            depth[0] += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                depth[0] -= 1

    real_apply = torch.autograd.Function.apply.__func__

    def apply(cls, *a, **k):
        seen["calls"][f"{_caller(torch_dir)} {cls.__name__}.apply"] += 1
        return real_apply(cls, *a, **k)

    x, probs, splits, dy = inputs(torch, local, tokens)
    layer_pass(torch, mods, tally, x, probs, splits, dy)
    out = {}
    torch.autograd.Function.apply = classmethod(apply)
    tally.mode = Calls
    try:
        fc1, fc2 = mods[:2]
        tally.take()
        with Calls():
            h = fc1(x, splits, is_first_microbatch=False)
            gate, up = torch.chunk(h, 2, dim=-1)
            y = fc2((torch.nn.functional.silu(gate) * up * probs).to(torch.bfloat16), splits,
                    is_first_microbatch=False)
        out["fwd"] = {k: dict(v) for k, v in seen.items()}
        out["fwd"]["gpu"] = tally.take()[0]
        for v in seen.values():
            v.clear()
        y.backward(dy)      # counted inside TE's backward and the hooks (tally.mode)
        out["bwd"] = {k: dict(v) for k, v in seen.items()}
        out["bwd"]["gpu"] = tally.take()[0]
    finally:
        torch.autograd.Function.apply = classmethod(real_apply)
        tally.mode = None
    return out
