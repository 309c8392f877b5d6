"""The analytical engine's predictions on the recorded GPT-3 175B / 1,024-GPU grid
(``benchmarks/data/analytical_sweep.json``, recorded with the engine this one replaced) are
unchanged to 1e-9 relative, as ``tests/test_golden.py`` pins the examples. The benchmark
(``python benchmarks/analytical_speed.py``) checks all 206 plans; this test every 16th, and the
deepest (TP8 PP32 v3, 384 micro-batches)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import ddlsim

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from analytical_speed import RECORDED, _plan, sweep  # noqa: E402
from tests.test_golden import PREDICTED, _flatten, mismatches  # noqa: E402

CONFIGS = sweep()
ROWS = json.loads(RECORDED.read_text())
DEEPEST = max(range(len(CONFIGS)), key=lambda i: CONFIGS[i].parallel.pp * CONFIGS[i].parallel.vpp
              * CONFIGS[i].num_microbatches)


def test_the_grid_is_the_recorded_one():
    assert [_plan(c) for c in CONFIGS] == [r["plan"] for r in ROWS]


@pytest.mark.parametrize("i", sorted(set(range(0, len(ROWS), 16)) | {DEEPEST}))
def test_recorded_plan_unchanged(i):
    r = ddlsim.predict(CONFIGS[i], check_fit=False).to_dict()
    got = _flatten({k: v for k, v in r.items() if k in PREDICTED})
    want = _flatten({k: v for k, v in ROWS[i].items() if k in PREDICTED})
    assert not mismatches(got, want), ROWS[i]["plan"]
