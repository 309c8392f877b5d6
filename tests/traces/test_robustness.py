"""The trace readers answer any input with a result or a ConfigError, never a traceback."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.errors import ConfigError
from ddlsim.traces.kineto import parse_kineto
from ddlsim.traces.mpilog import read_mpilog

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
CATS = ["cpu_op", "python_function", "user_annotation", "kernel", "fwdbwd", None]
NAMES = ["nn.Module: Block_0", "nn.Module: Net_0", "nn.Module: MLP_0", "aten::mm",
         "autograd::engine::evaluate_function: MmBackward0", "Optimizer.step#SGD.step",
         "nccl:all_reduce", "x"]
event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "i", "M"]), "cat": st.sampled_from(CATS),
     "name": st.sampled_from(NAMES), "ts": st.one_of(st.floats(-10, 1e3), scalars),
     "dur": st.one_of(st.floats(0, 1e3), scalars), "tid": st.sampled_from([1, 2])},
    optional={"args": st.one_of(values, st.fixed_dictionaries(
        {}, optional={"External id": st.integers(0, 5), "Sequence number": st.integers(0, 5),
                      "Input Dims": values}))})


@SETTINGS
@given(st.one_of(values, st.fixed_dictionaries({"traceEvents": st.lists(event, max_size=25)})))
def test_kineto_reader_never_crashes(doc):
    try:
        parse_kineto(doc)
    except ConfigError:
        pass


record = st.one_of(
    st.fixed_dictionaries({"call": st.sampled_from(["allreduce", "send", "recv", "wait",
                                                    "bcast", "barrier", "nope"]),
                           "t0": st.one_of(st.floats(0, 10), scalars),
                           "t1": st.one_of(st.floats(0, 10), scalars)},
                          optional={"bytes": scalars, "peer": scalars, "root": scalars,
                                    "comm": st.sampled_from(["world", "dp", 3]),
                                    "nb": st.booleans(), "req": scalars,
                                    "reqs": values, "tag": scalars}),
    st.fixed_dictionaries({"comm": st.sampled_from(["dp", "world"]), "ranks": values}),
    values)


@SETTINGS
@given(st.lists(st.lists(record, max_size=8), min_size=1, max_size=3), st.booleans())
def test_mpilog_reader_never_crashes(tmp_path_factory, logs, header):
    d = tmp_path_factory.mktemp("logs")
    for rank, recs in enumerate(logs):
        head = [{"ddlsim_mpilog": 1, "rank": rank, "size": len(logs)}] if header else []
        (d / f"x.{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in head + recs))
    try:
        read_mpilog(d)
    except ConfigError:
        pass


@SETTINGS
@given(st.lists(st.binary(max_size=60), min_size=1, max_size=2))
def test_chakra_reader_never_crashes(tmp_path_factory, blobs):
    pytest.importorskip("google.protobuf")
    from ddlsim.traces.chakra_read import read_chakra
    d = tmp_path_factory.mktemp("et")
    for rank, blob in enumerate(blobs):
        (d / f"x.{rank}.et").write_bytes(blob)
    try:
        read_chakra(d)
    except ConfigError:
        pass
