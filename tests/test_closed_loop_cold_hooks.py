"""The torch loop's FSDP2 host costs in the cache state of its iteration (issue 30): on a CPU
device, whose kernels sweep the caches between two units' hooks, FSDP2's hooks are charged
their cold-cache figures (fsdp2_host.COLD_HOOK_TINY_OPS, benchmarks/fsdp2_host_costs.py
--evict llc); a GPU keeps the hot ones. The trainer clears the gradients as torchtitan-2024
does (``zero_grad()``: set to None, no ``zero_`` pass, no ``+=`` into an old gradient), and
DTensor's step host time counts the ATen ops that step runs.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.reference.loop import SMALL
from ddlsim.reference.torch_loop import TORCH_STACK, torch_available, torch_model, torch_run_config
from ddlsim.workloads.decoder import fsdp2_host as fp

needs_torch = pytest.mark.skipif(not torch_available(), reason="torch with Gloo is not "
                                 "installed (pip install 'ddlsim[torch]')")

US = 1e-6
#: the loop's dispatch gap (torch_machine.py's launch facts on the machine of 2026-11-30)
GAP_S = 1.3 * US


def _cpu_config(ranks: int = 2):
    """The loop's ``torch-fsdp`` run on a CPU system with torch_machine.py's launch facts."""
    from ddlsim.reference.machine import local_system
    system = local_system(ranks, 1e11, 3e10, (1e-5, 1e9), 8e9, "test")
    system["device"]["launch"] = {"host_launch_s": 0.0, "eager_op_s": 0.0,
                                  "stream_gap_s": GAP_S, "graph_gap_s": GAP_S,
                                  "source": "test"}
    system["software"] = TORCH_STACK
    return ddlsim.load_config(torch_run_config(torch_model(SMALL), ranks, "torch-fsdp", system))


def _gpu_config():
    return ddlsim.load_config({
        "model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
        "parallel": {"zero_stage": 3, "data_parallel_size": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 2048,
                  "dtype": "bf16"},
        "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 2,
                   "software": {"stack": "torchtitan-2025"}}})


def _hooks(cfg, name: str, backward: bool) -> list[float]:
    blocks = ddlsim.build_workload(cfg).classes[0].program.blocks
    block = next(b for n, b in blocks.items() if n.startswith("B" if backward else "F"))
    return sorted(o.payload.seconds for o in block.flat.ops if o.payload.name == name)


@pytest.mark.parametrize("backward", [False, True])
def test_the_loop_charges_its_blocks_hooks_cold(backward):
    """A block of the loop's model (12 tensors, sharded over 2 ranks): its pre-hook is
    ``(a + 12 b)`` cold tiny ops of the dispatch gap, the pre-hook's share."""
    a, b = fp.COLD_HOOK_TINY_OPS[True, backward]
    pre = (a + 12 * b) * GAP_S * (1 - fp.POST_HOOK_SHARE[True, backward])
    hot_a, hot_b = fp.HOOK_TINY_OPS[True, backward]
    assert a + 12 * b > hot_a + 12 * hot_b
    pres = _hooks(_cpu_config(), "fsdp2.pre_hook", backward)
    assert len(pres) == 3                       # two blocks and the root
    assert pres[-2:] == [pytest.approx(pre, rel=1e-12)] * 2


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_cold_hooks_are_the_cpus_and_hot_hooks_a_gpus(sharded, backward):
    cpu = _cpu_config().system.device.launch
    gpu = _gpu_config().system.device.launch
    shards = 2 if sharded else 1
    for launch, table in ((cpu, fp.COLD_HOOK_TINY_OPS), (gpu, fp.HOOK_TINY_OPS)):
        a, b = table[sharded, backward]
        whole = sum(fp.hook_seconds(launch, shards, backward, 9, post) for post in (False, True))
        assert whole == pytest.approx((a + 9 * b) * fp.tiny_op_s(launch), rel=1e-12)


def test_a_gpu_block_keeps_its_hot_hooks():
    """The H200's sharded Llama blocks (9 tensors): the pre-hook at the hot figures."""
    launch = _gpu_config().system.device.launch
    a, b = fp.HOOK_TINY_OPS[True, False]
    pre = (a + 9 * b) * (launch.eager_op_s + launch.host_launch_s) \
        * (1 - fp.POST_HOOK_SHARE[True, False])
    assert pytest.approx(pre, rel=1e-12) in _hooks(_gpu_config(), "fsdp2.pre_hook", False)


def test_the_loops_system_says_its_hooks_are_charged_cold():
    from ddlsim.reference.torch_machine import torch_system
    doc = {"rates_by_round": {"gradients": [3e10], "op_overhead_s": [GAP_S]}}
    system = torch_system(1, doc, 1e11, None, "median", "test")
    assert "COLD_HOOK_TINY_OPS" in system["device"]["launch"]["source"]


def _aten_ops_per_tensor(call, tensors: int) -> float:
    """ATen ops ``call()`` runs on the parameters' state, per parameter tensor (a dispatch
    mode counting the ops whose first tensor has a dimension: not Adam's 0-dim ``step``
    counter, as ``benchmarks/torchbench.on_state`` counts them)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            Count.n += first is not None and first.dim() > 0
            return func(*args, **(kwargs or {}))
    with Count():
        call()
    return Count.n / tensors


@needs_torch
def test_dtensor_step_counts_the_ops_of_the_trainers_step():
    """torch's single-tensor Adam step and ``zero_grad()`` (set to None) over 28 plain
    tensors, the loop's count: STEP_OPS_PER_TENSOR ATen ops each (``zero_grad(set_to_none=
    False)`` would add a ``zero_``)."""
    import torch
    params = [torch.nn.Parameter(torch.randn(8)) for _ in range(28)]
    opt = torch.optim.Adam(params, lr=1e-3)

    def step():
        for p in params:
            p.grad = torch.ones(8)
        opt.step()                       # the first creates Adam's state
    step()
    for p in params:
        p.grad = torch.ones(8)

    def trainers():
        opt.step()
        opt.zero_grad()
    assert _aten_ops_per_tensor(trainers, 28) == fp.STEP_OPS_PER_TENSOR


@needs_torch
@pytest.mark.parametrize("strategy, plan, ranks", [("torch-ddp", "ddp", 1),
                                                   ("torch-fsdp", "fsdp", 2)])
def test_the_trainer_sets_its_gradients_to_none(tmp_path, strategy, plan, ranks):
    """After a step of the trainer every parameter's gradient is None, as torchtitan-2024
    leaves it; zeroed gradients would cost a ``zero_`` pass and a ``+=`` the trace has not."""
    import torch.distributed as dist
    import yaml

    from ddlsim.reference.torch_train import data_parallel_step
    from ddlsim.reference.train import shape_of
    path = tmp_path / f"{strategy}.yaml"
    path.write_text(yaml.safe_dump(torch_run_config(
        torch_model(SMALL), ranks, strategy, {"preset": "cpu-10gbe", "software": TORCH_STACK})))
    cfg = ddlsim.load_config(path)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        step = data_parallel_step(cfg, shape_of(cfg), plan)
        step()
        grads = [p.grad for p in step.model.parameters()]
    finally:
        dist.destroy_process_group()
    assert grads and all(g is None for g in grads)
