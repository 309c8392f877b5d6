"""benchmarks/device/wgrad_accumulate.py: the shapes it times are GPT-3 175B's weight gradients
(read on CPU; the timing needs a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PATH = Path(__file__).parents[1] / "benchmarks" / "device" / "wgrad_accumulate.py"


def _module():
    spec = importlib.util.spec_from_file_location("wgrad_accumulate", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_are_one_layers_weights_per_tp_and_token_count():
    wa = _module()
    rows = wa.shapes()
    assert len(rows) == 4 * len(wa.TPS) * len(wa.TOKENS)
    h = 12288
    for tp in wa.TPS:
        for k in wa.TOKENS:
            layer = [r for r in rows if r["tp"] == tp and r["k"] == k]
            # the four linears hold 12 h^2 / TP weights (Narayanan et al. 2021, sec. 5.1)
            assert sum(r["out"] * r["inp"] for r in layer) == 12 * h * h // tp

