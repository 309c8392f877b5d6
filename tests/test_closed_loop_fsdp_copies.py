"""FSDP2's copies in the torch loop (issue 30): the trace's copy-in, copy-out and
``_chunk_cat`` carry kernel classes (fsdp2_passes.COPY_IN, COPY_OUT, CHUNK_CAT), which the
loop's system times at the rates torch's own ops ran at on this machine
(reference/fsdp_copies.py), and which a device without their figures runs at its streaming
bandwidth, as before.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.reference.loop import SMALL
from ddlsim.reference.torch_loop import TORCH_STACK, torch_available, torch_model, torch_run_config

needs_torch = pytest.mark.skipif(not torch_available(), reason="torch with Gloo is not "
                                 "installed (pip install 'ddlsim[torch]')")

MODEL = torch_model(SMALL)
COPIES = {"zero3.copy_in": "fsdp_copy_in", "zero3.copy_out": "fsdp_copy_out",
          "zero3.chunk_cat": "chunk_cat"}


def _config(tmp_path, classes: dict | None = None):
    import yaml
    system = {"preset": "cpu-10gbe", "software": TORCH_STACK}
    if classes is not None:
        system["device"] = {"elementwise_efficiency": classes}
    path = tmp_path / f"fsdp-{len(classes or {})}-{sorted((classes or {}).values())}.yaml"
    path.write_text(yaml.safe_dump(torch_run_config(MODEL, 2, "torch-fsdp", system)))
    return ddlsim.load_config(path)


def test_fsdp2_copies_carry_their_kernel_classes(tmp_path):
    """Each copy of the loop's FSDP trace is one memory kernel of its class, of the op's
    bytes: 3 units' copy-in and copy-out forward, 2 blocks' again backward, 3 chunk_cats."""
    seen = {}
    for block in ddlsim.build_workload(_config(tmp_path)).classes[0].program.blocks.values():
        for op in block.flat.ops:
            name = getattr(op.payload, "name", "")
            if name in COPIES:
                (kernel,) = op.payload.kernels
                assert (kernel.kind, kernel.variant) == ("memory", COPIES[name])
                assert kernel.bytes == op.payload.bytes > 0
                seen[name] = seen.get(name, 0) + 1
    assert seen == {"zero3.copy_in": 5, "zero3.copy_out": 5, "zero3.chunk_cat": 3}


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_the_copies_move_at_their_class_rate_and_default_to_streaming(tmp_path, engine):
    """At efficiency 1 the copies' classes change nothing (a device without them: a GPU
    preset); at 0.5 the copies take longer and the iteration with them."""
    base = ddlsim.predict(_config(tmp_path), engine).iteration_time_s
    ones = ddlsim.predict(_config(tmp_path, dict.fromkeys(COPIES.values(), 1.0)),
                          engine).iteration_time_s
    half = ddlsim.predict(_config(tmp_path, dict.fromkeys(COPIES.values(), 0.5)),
                          engine).iteration_time_s
    assert ones == pytest.approx(base, rel=1e-12)
    assert half > base


def test_the_loop_system_takes_the_copies_measured_rates():
    """torch_system gives the FSDP classes the torch job measured their own fraction of the
    streaming rate; a job without them (DDP only) gives none."""
    from ddlsim.reference.kernels import CLASS_KERNELS
    from ddlsim.reference.torch_machine import torch_system
    rates = {"gradients": [30e9, 32e9], "op_overhead_s": [1.2e-6, 1.1e-6],
             **{f"class.{c}": [15e9, 16e9] for c in CLASS_KERNELS}}
    plain = torch_system(1, {"rates_by_round": rates}, 9e10, None, "min", "test")
    assert not {"fsdp_copy_in", "fsdp_copy_out", "chunk_cat"} \
        & set(plain["device"]["elementwise_efficiency"])
    rates |= {"class.fsdp_copy_in": [16e9, 16.5e9], "class.fsdp_copy_out": [21e9, 22e9],
              "class.chunk_cat": [20e9, 19e9]}
    got = torch_system(1, {"rates_by_round": rates}, 9e10, None, "min", "test")
    eff = got["device"]["elementwise_efficiency"]
    assert (eff["fsdp_copy_in"], eff["fsdp_copy_out"], eff["chunk_cat"]) == \
        (round(16.5 / 32, 4), round(22 / 32, 4), round(20 / 32, 4))


@needs_torch
def test_the_copy_samples_are_fsdp2s_own_ops():
    """fsdp_kernels runs torch.ops.fsdp's copy-in, copy-out and chunk_cat on a block's
    shapes, moving the data as FSDP2 does, and counts the bytes ddlsim's trace charges."""
    import torch

    from ddlsim.reference.fsdp_copies import fsdp_kernels
    from ddlsim.reference.torch_train import Block
    from ddlsim.workloads.decoder.fsdp2_passes import reduce_passes, unshard_passes
    params = list(Block(16, 2).parameters())
    n = sum(p.numel() for p in params)
    calls = fsdp_kernels(params, 2, 0)
    assert {k: v[1] for k, v in calls.items()} == {
        "fsdp_copy_in": unshard_passes(n, 2, 4).copy_in,
        "fsdp_copy_out": unshard_passes(n, 2, 4).copy_out,
        "chunk_cat": reduce_passes(n, 2, 4, 4, 1).chunk_cat}
    for name in ("fsdp_copy_in", "fsdp_copy_out", "chunk_cat"):
        calls[name][0]()
    shards, unsharded = _closed(calls["fsdp_copy_in"][0])["shards"], \
        _closed(calls["fsdp_copy_out"][0])["unsharded"]
    for shard, full in zip(shards, unsharded):     # rank 0's half of each parameter
        assert torch.equal(full[0], shard)
    cat = _closed(calls["chunk_cat"][0])
    want = torch.cat([g.chunk(2)[1].reshape(-1) for g in cat["grads"]])
    assert torch.equal(cat["scatter_input"][1], want)


def _closed(call) -> dict:
    """The variables a sample's call closed over, by name."""
    return dict(zip(call.__code__.co_freevars, (c.cell_contents for c in call.__closure__)))
