"""validate_torchtitan ``--cp-split``'s ring-step count and the shortfall per ring step.

The per-step view of torchtitan's Table 2 (Llama 3.1 8B, FSDP × CP on one host): each row holds
32768 tokens per rank, so every ring step is the same call on every row and a per-step cost the
model lacked would add the same time to each step. The published rows need about 4 ms a step at
CP 2 and about 25 ms at CP 4 and 8 (docs/tensor_parallel.md, "PyTorch's ring").
"""

from __future__ import annotations

import pytest
from benchscripts import load_script

import ddlsim

vt = load_script("validate_torchtitan")
EIGHT_B = {r["cp"]: r for r in vt.rows() if r["table"] == "2" and r["set"] == "2024"}
LAYERS = 32          # Llama 3.1 8B (ddlsim/data/models.yaml)


@pytest.mark.parametrize("recompute, passes", [("full", 3), ("none", 2)])
@pytest.mark.parametrize("cp", ["2", "8"])
def test_ring_steps_are_layers_times_passes_times_cp(cp, recompute, passes):
    # one step per cp rank per pass of each layer: forward, the recomputed forward under full
    # recomputation, backward (partition/torch_cp.py attention_forward / attention_backward)
    cfg = vt.config(EIGHT_B[cp])
    cfg["train"]["recompute"] = recompute
    assert vt.ring_steps(ddlsim.load_config(cfg)) == LAYERS * passes * int(cp)


def test_no_ring_steps_without_context_parallelism():
    assert vt.ring_steps(ddlsim.load_config(vt.config(EIGHT_B["1"]))) == 0


def test_residual_per_step_is_the_shortfall_over_the_ring_steps():
    one, two = vt.cp_split([EIGHT_B["1"], EIGHT_B["2"]])
    assert one["ring_steps"] == 0 and one["residual_per_step"] is None
    assert two["ring_steps"] == LAYERS * 3 * 2
    assert two["residual_per_step"] == pytest.approx(
        (two["published"] - two["predicted"]) / two["ring_steps"], rel=1e-12)
