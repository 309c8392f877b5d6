"""The unfused attention's softmax as PyTorch's CUDA kernels run it, by the stack's
``softmax_dispatch`` (ddlsim/simulator/kernels/softmax.py), derived by hand from
aten/src/ATen/native/cuda/SoftMax.cu, and set beside the H200 sweep's measured softmax
(benchmarks/data/device_h200_2026-11-30/run1/kernels, PyTorch 2.11)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from typing import get_args

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels import kernel_device
from ddlsim.simulator.kernels.softmax import SOFTMAX_DISPATCH, softmax_passes
from ddlsim.software import resolve_software, stacks
from ddlsim.software_fields import SoftmaxDispatch

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ROOT = Path(__file__).parents[1]
SWEEP = ROOT / "benchmarks" / "data" / "device_h200_2026-11-30" / "run1" / "kernels"


def test_torch_1_8_rereads_a_long_row():
    # a 2,048-key fp32 row is 8 KB, over the warp kernel's 4 KB: cunn_SoftMaxForward reads
    # it for the max, for the sum of exp and in the epilogue (3 x 4 B), writes once (4 B)
    assert softmax_passes(2048, 4, "torch-1.8", False) == [16]
    # backward: tmp = grad * output (read 2, write 1), then cunn_SoftMaxBackward reads tmp
    # twice and the output once, writes the input gradient
    assert softmax_passes(2048, 4, "torch-1.8", True) == [12, 16]
    # 1,024 fp32 keys (4 KB) fit the persistent warp kernels: each row read once
    assert softmax_passes(1024, 4, "torch-1.8", False) == [8]
    assert softmax_passes(1024, 4, "torch-1.8", True) == [12, 12]


def test_later_torch_caches_the_row():
    # torch 2.5: the forward caches a 4,096-key bf16 row (8 KB) in shared memory, the
    # backward still re-reads grad * output
    assert softmax_passes(4096, 2, "torch-2.5", False) == [4]
    assert softmax_passes(4096, 2, "torch-2.5", True) == [6, 8]
    # torch 2.10: the warp kernel takes 2,048 keys forward, registers up to 9 x 1,024,
    # shared memory beyond; the backward's rows in shared memory (48 KB a block)
    assert softmax_passes(2048, 2, "torch-2.10", False) == [4]
    assert softmax_passes(2048, 4, "torch-2.10", False) == [8]
    assert softmax_passes(9216, 4, "torch-2.10", False) == [8]
    assert softmax_passes(2048, 2, "torch-2.10", True) == [6, 6]
    # a 32,768-key bf16 row is 64 KB, over 48 KB: re-read both ways
    assert softmax_passes(32768, 2, "torch-2.10", False) == [8]
    assert softmax_passes(32768, 2, "torch-2.10", True) == [6, 8]
    # one_pass (the numpy reference's own softmax): one kernel each way
    assert softmax_passes(32768, 4, "one_pass", False) == [8]
    assert softmax_passes(32768, 4, "one_pass", True) == [12]


def test_an_unknown_dispatch_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="torch-1.8"):
        softmax_passes(2048, 2, "torch-3", False)
    with pytest.raises(ConfigError) as e:
        ddlsim.load_config(str(ROOT / "examples" / "llama3-8b-fsdp2-h100.yaml"),
                           ["system.software={stack: torchtitan-2025, "
                            "kernels: {softmax_dispatch: torch-3}}"])
    assert all(w in str(e.value) for w in ("softmax_dispatch", "torch-3", "torch-2.10"))


def test_every_stack_names_its_softmax_dispatch_with_a_source():
    assert set(get_args(SoftmaxDispatch)) == set(SOFTMAX_DISPATCH)
    for stack in stacks():
        sw = resolve_software(stack)
        assert sw.softmax_dispatch in SOFTMAX_DISPATCH
        assert "SoftMax.cu" in sw.sources["softmax_dispatch"] or \
            "pytorch/pytorch#" in sw.sources["softmax_dispatch"]
    assert resolve_software("megatron-lm-2021").softmax_dispatch == "torch-1.8"
    assert resolve_software("torchtitan-2025").softmax_dispatch == "torch-2.10"


def test_the_h200_softmax_backward_is_two_kernels_at_the_streaming_rate():
    # PyTorch 2.11's _softmax_backward_data over 64 x 2048 rows of 2,048 bf16 keys: the mul
    # (6 B) and cunn_SoftMaxBackwardSmem (6 B), 3.2 GB in 738 us measured (4.4 TB/s)
    spec = importlib.util.spec_from_file_location(
        "device_compare", ROOT / "benchmarks" / "device_compare.py")
    script = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec.loader.exec_module(script)
    dev = kernel_device(script.load_system("dgx-h200", "torchtitan-2025"))
    rows = {r["kernel"]: r for r in csv.DictReader(open(SWEEP / "memory.csv"))}
    r = rows["softmax_bwd"]
    got, _ = script.memory_s("softmax_bwd", float(r["elements"]), 1.0, dev,
                             resolve_software("torchtitan-2025").softmax_dispatch)
    assert got / float(r["seconds"]) - 1 == pytest.approx(0.0, abs=0.05)
