"""Transformer Engine's fused cross-entropy's passes and kept bytes (TE v2.7 fedd9ddc
``pytorch/triton/cross_entropy.py``, as Megatron-Core's ``--cross-entropy-fusion-impl te`` calls
it): forward ``online_softmax_kernel`` reads the 16-bit logits, ``cross_entropy_kernel`` reads
them again and writes the softmax gradient into them in place; backward ``element_mul_kernel``
scales it in place; only the 16-bit logits are kept (2 B per logit; Megatron-Core's own
fusion: 6 B). Bytes by hand. The stack's field, the trace and the rules:
tests/test_te_cross_entropy.py."""

from __future__ import annotations

import pytest

from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.step_passes import (cross_entropy_impl, loss_bytes, loss_kernels,
                                                  loss_passes)
from ddlsim.workloads.framework_memory import framework

T = 2


def test_te_passes_read_the_logits_twice_and_write_the_gradient_in_place():
    # bf16: forward online softmax (read 2) and gradient (read 2, write 2); backward the
    # in-place multiply (read 2, write 2). Megatron-Core's own: 6 + 8 + 8, then 6
    assert loss_passes(2, "te") == [2, 4]
    assert loss_passes(2, "te", backward=True) == [4]
    assert loss_passes(2, "native") == loss_passes(2, True) == [6, 8.0, 8.0]
    assert loss_bytes(4096, 65536, 2, "te") + loss_bytes(4096, 65536, 2, "te", True) \
        == 4096 * 65536 * (6 + 4)
    fwd = loss_kernels(1e6, 2, "te")
    assert [k.bytes for k in fwd] == [2e6, 4e6] and {k.variant for k in fwd} == {""}


def test_the_impl_is_read_under_the_fusion_only_and_checked():
    assert cross_entropy_impl(True, "te") == "te"
    assert cross_entropy_impl(False, "te") == "unfused"
    with pytest.raises(ValueError, match=r"cross_entropy_fusion_impl = 'triton'.*native, te"):
        cross_entropy_impl(True, "triton")
    with pytest.raises(ValueError, match=r"'liger'.*allowed: unfused, native, te"):
        loss_passes(2, "liger")


def test_megatron_keeps_2_bytes_per_logit_under_te():
    fm = framework("megatron-core-2025")
    assert fm.logits_at(T, False, "te") == 2
    assert fm.logits_at(T, False, "native") == fm.logits_at(T, False, "unfused") == 6
    with pytest.raises(ConfigError, match=r"cross_entropy_fusion_impl = 'te'.*allowed there"):
        framework("torchtitan-2025").logits_at(T, False, "te")
