"""Per-call costs of a search grid cut without changing what it computes (issue 27's speed
target; task H8): a compute op's hash computed once, on first use, with the generated hash's
value and never carried to another process; each signature's plan fields read for all
signatures at once."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from ddlsim.search.blocks import _group_fields, _wanted
from ddlsim.search.plans import RECOMPUTE, PlanSet
from ddlsim.workloads.payloads import Collective, Compute, Contention, Kernel


class _Counted(str):
    """A string that counts how often it is hashed (a field's value, as a kernel holds it)."""

    hashes = 0

    def __hash__(self) -> int:
        type(self).hashes += 1
        return str.__hash__(self)


def _generated(obj) -> int:
    """The hash the dataclass generates: of the tuple of its compared fields."""
    return hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare))


def _examples() -> list:
    k = Kernel("gemm", (1024.0, 4096.0, 512.0), dtype="bf16")
    coll = Collective("ar", "all_reduce", "dp", 1e6)
    return [Compute("mlp", 2e12, kernels=(k, k)), Compute("ew", 0.0, 4e6, kind="elementwise"),
            Compute("c", 1e9, contention=Contention(1e9, 0, (coll,), (2,)), host_s=1e-6)]


@pytest.mark.parametrize("obj", _examples(), ids=lambda o: o.name)
def test_the_kept_hash_is_the_generated_one(obj):
    """Dicts and sets of ops order alike with and without the kept hash."""
    assert hash(obj) == _generated(obj) == hash(obj)
    copy = dataclasses.replace(obj)
    assert copy == obj and hash(copy) == hash(obj)


def test_a_compute_op_is_hashed_once():
    """Its fields (and its kernels) are hashed on its first hash only, not at its making."""
    _Counted.hashes = 0
    op = Compute(_Counted("mlp"), 2e12, kernels=(Kernel("gemm", (8.0, 8.0, 8.0)),))
    assert _Counted.hashes == 0
    for _ in range(5):
        hash(op)
        assert {op: 1}[op] == 1
    assert _Counted.hashes == 1
    twin = Compute(_Counted("mlp"), 2e12, kernels=(Kernel("gemm", (8.0, 8.0, 8.0)),))
    assert {op: 1}[twin] == 1 and _Counted.hashes == 2   # an equal op: its own first hash


def test_an_unhashable_field_fails_when_hashed_not_when_made():
    op = Compute("x", 1.0, kernels=[Kernel("gemm", (1.0, 1.0, 1.0))])   # a list, not a tuple
    with pytest.raises(TypeError, match="unhashable"):
        hash(op)


def test_a_pickled_op_hashes_afresh_in_another_process():
    """An op pickled by a process with another string-hash seed is found in a dict of this
    process's ops (its kept hash is not pickled)."""
    code = ("import pickle, sys; from ddlsim.workloads.payloads import Compute, Kernel; "
            "op = Compute('mlp', 2.0, kernels=(Kernel('gemm', (1.0, 2.0, 3.0)),)); hash(op); "
            "sys.stdout.buffer.write(pickle.dumps(op))")
    seed = "54321" if os.environ.get("PYTHONHASHSEED") == "12345" else "12345"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    data = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          check=True).stdout
    theirs = pickle.loads(data)
    ours = Compute("mlp", 2.0, kernels=(Kernel("gemm", (1.0, 2.0, 3.0)),))
    assert theirs == ours and hash(theirs) == hash(ours)
    assert {ours: 1}[theirs] == 1


def test_each_signatures_fields_as_its_plans_give_them():
    """:func:`_group_fields` reads every signature's fields at once: as its first plan gives
    them, and whether some of its plans have one pipeline stage and some several."""
    rng = np.random.default_rng(7)
    n = 400
    plans = PlanSet({"mbs": rng.choice([1, 2, 4], n), "tp": rng.choice([1, 2, 8], n),
                     "sp": rng.integers(0, 2, n).astype(bool), "recompute": rng.integers(0, 3, n),
                     "zero": rng.integers(0, 4, n), "pp": rng.choice([1, 1, 2, 4], n)}, [])
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), 30, replace=False))
    groups = np.split(order, cuts)
    got = _group_fields(plans, groups)
    assert len(got) == len(groups)
    for fields, index in zip(got, groups):
        i0 = int(index[0])
        pp = plans["pp"][index]
        assert fields == (int(plans["mbs"][i0]), int(plans["tp"][i0]), bool(plans["sp"][i0]),
                          RECOMPUTE[int(plans["recompute"][i0])], int(plans["zero"][i0]),
                          bool((pp == 1).any()), bool((pp > 1).any()))
        assert [type(x) for x in fields] == [int, int, bool, str, int, bool, bool]
    assert _group_fields(plans, []) == []


@pytest.mark.parametrize("one,many,zero,absent", [
    (True, True, 0, set()), (False, True, 0, {"emb1", "emb_b1"}),
    (False, True, 3, {"emb1"}), (True, False, 1, {"load_l", "emb_b"})])
def test_the_pieces_a_signature_reads(one, many, zero, absent):
    from ddlsim.search.blocks import _PIECES
    assert _wanted(one, many, zero) == set(_PIECES) - absent


def test_a_cold_grid_forgets_the_memos_keyed_by_value():
    """The benchmark's cold grid (:func:`~ddlsim.search.netcost.cache_clear`) leaves no
    memo a later grid would find by value: the final norm's and the embedding backward's
    ops, NCCL's channel and tree rules per network."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.netcost import cache_clear
    from ddlsim.search.spec import Constraints
    from ddlsim.simulator.collectives.nccl import model as nccl_model
    from ddlsim.workloads.decoder import embedding_grad, layerkernels

    base = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}
    evaluate_grid(base, None, [], {"parallel.tensor_model_parallel_size": [1, 2],
                                   "parallel.pipeline_model_parallel_size": [1, 2]},
                  Constraints())
    memos = (layerkernels.final_norm_op, embedding_grad.embedding_backward_op,
             nccl_model._channel_rule, nccl_model._tree_levels)
    assert all(m.cache_info().currsize for m in memos[:3])   # the grid filled them
    cache_clear()
    assert [m.cache_info().currsize for m in memos] == [0, 0, 0, 0]
