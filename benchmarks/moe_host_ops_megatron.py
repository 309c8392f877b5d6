"""The Megatron side of benchmarks/moe_host_ops.py: one Megatron-LM ``MoELayer`` run on CPU
over two gloo ranks, counting per part of the layer the forward's calls into torch and ATen ops
and the backward's autograd nodes and ATen ops (its docstring and data/moe_host_ops/README.md
say what is counted and what was patched). Needs torch and a Megatron-LM checkout; imports
neither at module level.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
import types
from pathlib import Path

VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "unsqueeze", "squeeze", "split",
         "split_with_sizes", "chunk", "slice", "select", "alias", "detach", "as_strided",
         "permute", "unbind", "view_as", "reshape", "_reshape_alias", "lift_fresh"}
ALLOC = {"empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided"}


def aten_kind(func) -> str:
    """``c10d``, ``view``, ``alloc``, ``item`` or ``kernel`` (launches on a GPU) of an ATen op."""
    if func.namespace == "c10d":
        return "c10d"
    if getattr(func, "is_view", False) or func._opname in VIEWS:
        return "view"
    return "alloc" if func._opname in ALLOC else \
        "item" if func._opname == "_local_scalar_dense" else "kernel"


class Tally:
    """What one pass counts, per part label: calls into torch (``calls``, and where each was
    made: ``where``), ATen ops by kind and by name, autograd nodes, the GPU path's CUDA calls
    (``gpu``), and the thread CPU µs each part ran (``us``, across passes)."""

    def __init__(self) -> None:
        self.label, self.on, self.t = "outside", False, time.thread_time_ns()
        self.us, self.c10d_us, self.tagged = collections.Counter(), collections.Counter(), {}
        self.timing = False         # timed passes: the labelled steps tag their outputs
        self.take()

    def take(self) -> dict:
        """The counts so far, as JSON-ready dicts; the counters start again."""
        out = {} if not hasattr(self, "calls") else {
            "calls": dict(self.calls), "aten": dict(self.aten), "nodes": dict(self.nodes),
            "where": {k: dict(v) for k, v in self.where.items()},
            "aten_ops": {k: dict(v) for k, v in self.names.items()},
            "gpu_calls": {f"{k[0]}|{k[1]}": v for k, v in self.gpu.items()}}
        self.calls, self.aten, self.nodes, self.gpu = (collections.Counter() for _ in range(4))
        self.where, self.names = (collections.defaultdict(collections.Counter) for _ in range(2))
        return out

    def switch(self, label: str) -> None:
        """Make ``label`` the current part, charging the CPU time since the last switch."""
        now = time.thread_time_ns()
        self.us[self.label] += (now - self.t) / 1e3
        self.label, self.t = label, now

    def note(self, name: str) -> None:
        """One call of the GPU path that the CPU run does not make."""
        self.gpu[self.label, name] += 1

    def tag(self, out) -> None:
        """Tag the autograd nodes behind ``out`` not yet tagged with the current part."""
        todo = [getattr(t, "grad_fn", None) for t in
                (out if isinstance(out, (tuple, list)) else (out,))]
        while todo:
            n = todo.pop()
            if n is not None and n not in self.tagged:
                self.tagged[n] = self.label
                todo += [m for m, _ in n.next_functions]

    def prehook(self, node):
        """A backward pre-hook making ``node``'s part current and counting the node."""
        def pre(grads):
            self.label = "bwd." + self.tagged.get(node, "untagged")
            self.nodes[self.label] += 1
        return pre

    def timed_prehook(self, node):
        """A backward pre-hook charging the time since the last node began to that node's
        part and making ``node``'s part current: a node's time runs to the next node's start,
        the autograd engine's work between them included (one hook per node, whose own cost
        the timed passes measure and take out: :func:`timing_worker`)."""
        label = "bwd." + self.tagged.get(node, "untagged")

        def pre(grads):
            self.switch(label)
            self.nodes[label] += 1
        return pre


def _cuda_stand_ins(torch, tally: Tally) -> None:
    """The CUDA calls Megatron's dispatcher and RNG tracker make, on CPU, each counted."""
    class Event:
        def synchronize(self): tally.note("Event.synchronize")

    class Stream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, other): tally.note("Stream.wait_stream")
        def synchronize(self): tally.note("Stream.synchronize")
        def record_event(self): tally.note("Stream.record_event"); return Event()  # noqa: E702

    class StreamContext:
        def __init__(self, s): tally.note("cuda.stream")
        def __enter__(self): return self
        def __exit__(self, *a): return False

    current = Stream()

    def current_stream(*a):
        tally.note("cuda.current_stream")
        return current

    def get_state(*a, **k):
        tally.note("cuda.get_rng_state")
        return torch.get_rng_state()

    def set_state(new_state, *a, **k):
        tally.note("cuda.set_rng_state")
        torch.set_rng_state(new_state)
    torch.cuda.Stream, torch.cuda.stream = Stream, StreamContext
    torch.cuda.current_stream, torch.cuda.current_device = current_stream, lambda: "cpu"
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: None
    from megatron.core.tensor_parallel import random as mrandom
    mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = get_state, set_state


def _layer(torch, local: int, world: int, router_dtype):
    """Megatron's MoELayer (local spec) as the rows configure it, ``local`` experts per rank."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    experts = local * world
    cfg = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=64,
        moe_ffn_hidden_size=32, num_moe_experts=experts, moe_router_topk=min(8, experts),
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
        moe_router_force_load_balancing=True, moe_router_dtype=router_dtype,
        moe_token_dispatcher_type="alltoall", moe_permute_fusion=False, moe_grouped_gemm=False,
        tensor_model_parallel_size=world, sequence_parallel=True,
        expert_model_parallel_size=world, expert_tensor_parallel_size=1, bf16=True,
        params_dtype=torch.bfloat16, add_bias_linear=False, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, use_cpu_initialization=True,
        gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    layer = MoELayer(cfg, spec.submodules.mlp.submodules).to(torch.bfloat16)
    layer.train()
    layer.set_layer_number(1)       # the aux-loss tracker records per layer
    return layer


def _tensors(out) -> list:
    """The tensors in a step's output (nested tuples, lists and dicts)."""
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in _tensors(x)]
    if isinstance(out, dict):
        return _tensors(list(out.values()))
    return [out] if hasattr(out, "grad_fn") else []


def _label(layer, tally: Tally) -> None:
    """Wrap the layer's steps so that each call runs under its part's label."""
    from megatron.core.transformer.moe import token_dispatcher as td

    def labelled(obj, name, label):
        fn = getattr(obj, name)

        def wrap(*a, **k):
            prev = tally.label
            mine = label(prev) if callable(label) else label
            tally.switch(mine)
            try:
                out = fn(*a, **k)
            finally:
                tally.switch(prev)
            if tally.timing:        # its autograd nodes: this step's (charged to "tag")
                tally.switch("tag")
                tally.label = mine
                tally.tag(_tensors(out))
                tally.label = "tag"
                tally.switch(prev)
            return out
        setattr(obj, name, wrap)
    d = layer.token_dispatcher
    labelled(layer.router, "forward", "router")
    labelled(layer.experts, "forward", "experts")
    if hasattr(d, "dispatch_preprocess"):       # d7288711: the dispatcher's own steps
        for name in ("dispatch_preprocess", "token_dispatch", "dispatch_postprocess",
                     "combine_preprocess", "token_combine", "combine_postprocess"):
            labelled(d, name, name.replace("token_", "").split("_")[0] + "." + name)
    else:                                       # 1e057005: two methods, labelled by step
        step = lambda s: (lambda prev: prev.split(".")[0] + "." + s)   # noqa: E731
        labelled(d, "token_permutation", "dispatch")
        labelled(d, "token_unpermutation", "combine")
        labelled(d, "preprocess", "dispatch.preprocess")
        labelled(d, "_maybe_dtoh_and_synchronize", step("dtoh_sync"))
        for name in ("permute", "unpermute", "all_to_all", "sort_chunks_by_idxs"):
            labelled(td, name, step(name))


def _modes(torch, tally: Tally) -> tuple:
    """The two counting modes (calls into torch; ATen ops) and ``Function.apply`` counted."""
    import linecache

    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            f, on = sys._getframe(1), tally.on
            skip = on and "torch.cuda.current_device()" in linecache.getline(
                f.f_code.co_filename, f.f_lineno)        # the CPU-only weight move
            tally.on = on and not skip
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                tally.on = on
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
            if on and not skip and not name.endswith((".__get__", ".__set__")):
                tally.calls[tally.label] += 1
                tally.where[tally.label][f"{Path(f.f_code.co_filename).name}:{f.f_lineno} "
                                         f"{name}"] += 1
                tally.tag(out)
            return out

    class Aten(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if tally.on:
                tally.aten[f"{tally.label}|{aten_kind(func)}"] += 1
                tally.names[tally.label][func._opname] += 1
            return func(*args, **(kwargs or {}))

    real_apply = torch.autograd.Function.apply.__func__

    def apply(cls, *a, **k):
        if tally.on:
            tally.calls[tally.label] += 1
            tally.where[tally.label][f"{cls.__name__}.apply"] += 1
        out = real_apply(cls, *a, **k)
        if tally.on:
            tally.tag(out)
        return out
    torch.autograd.Function.apply = classmethod(apply)
    return Calls, Aten


def _setup(torch, megatron: str, local: int, world: int, router_dtype, tally: Tally):
    """Megatron on CPU: the stand-ins, the process groups (TP and EP over the ``world``
    ranks, expert TP 1), the layer with its parts labelled."""
    stub = types.ModuleType("megatron.core.fusions.fused_indices_converter")
    stub.fused_indices_to_multihot = None       # it imports triton (flex dispatcher only)
    sys.modules[stub.__name__] = stub
    sys.path.insert(0, megatron)
    _cuda_stand_ins(torch, tally)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import token_dispatcher as td
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world,
                                             expert_model_parallel_size=world,
                                             expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(123)

    def move(tensor, as_numpy=False, record_stream=False):     # the GPU path's calls
        if torch.is_tensor(tensor):
            tally.note("dtoh.to")
            for _ in range(2 if record_stream else 0):
                tally.note("dtoh.record_stream")                # and its current_stream()
            return tensor.numpy() if as_numpy else tensor
        return tensor
    td.maybe_move_tensor_to_cpu = move
    layer = _layer(torch, local, world, router_dtype)
    _label(layer, tally)
    return layer


def _pass(torch, layer, tally: Tally, modes: tuple, seed: int) -> tuple:
    """One forward and backward, counted under ``modes`` (none: timed only): the forward's
    and the backward's counts and their thread CPU µs."""
    from contextlib import ExitStack
    torch.manual_seed(seed)
    x = torch.randn(16, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(16, 1, 64, dtype=torch.bfloat16)
    tally.tagged.clear()
    tally.take()
    counts, us = [], []
    for step in ("fwd", "bwd"):
        hooks = [n.register_prehook(tally.prehook(n)) for n in tally.tagged] \
            if modes and step == "bwd" else []
        with ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode())
            tally.on, t0 = bool(modes), time.thread_time_ns()
            out = layer(x)[0] if step == "fwd" else out.backward(g)
            us.append((time.thread_time_ns() - t0) / 1e3)
            tally.on = False
        for h in hooks:
            h.remove()
        tally.switch("outside")
        counts.append(tally.take())
    return counts[0], counts[1], us


def worker(rank: int, world: int, megatron: str, local: int, router_dtype, out: str) -> None:
    """One gloo rank: build the layer, count one forward and backward (after a warm-up, and
    once more to check the count repeats), time ten more; rank 0 writes ``out`` (JSON)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", TORCHDYNAMO_DISABLE="1")
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    tally = Tally()
    layer = _setup(torch, megatron, local, world, router_dtype, tally)
    modes = _modes(torch, tally)
    _pass(torch, layer, tally, (), rank)     # warm-up: first-call allocations
    fwd, bwd, _ = _pass(torch, layer, tally, modes, rank)
    again = _pass(torch, layer, tally, modes, rank)
    times, parts = [], []
    for _ in range(10):
        tally.us.clear()
        times.append(_pass(torch, layer, tally, (), rank)[2])
        parts.append({k: v for k, v in tally.us.items() if k != "outside"})
    if rank == 0:
        Path(out).write_text(json.dumps({
            "fwd": fwd, "bwd": bwd, "repeat_same": (fwd, bwd) == again[:2], "times_us": times,
            "fwd_part_us": {k: sorted(p.get(k, 0.0) for p in parts)[5] for k in parts[0]},
            "torch": torch.__version__}, indent=1, sort_keys=True))
    dist.barrier()
    dist.destroy_process_group()
