"""Checks the DDP-pass tests share (ddlsim/workloads/decoder/dpsync.py)."""

import pytest

from ddlsim.workloads.trace import Collective


def assert_each_run_precedes(ops: list, runs: list, collective: str, passes: int) -> None:
    """Each bucket-pass op in ``runs`` comes before a ``collective`` of the buckets it passes
    over, with one kernel of the bucket's bytes per pass and bucket."""
    for o in runs:
        i = ops.index(o)
        after = next(x for x in ops[i:] if isinstance(x.payload, Collective))
        assert after.payload.name == collective
        assert [k.bytes for k in o.payload.kernels] == \
            pytest.approx([after.payload.bytes] * (passes * after.repeat))
