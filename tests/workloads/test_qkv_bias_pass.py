"""The QKV bias as passes of their own (``kernels.qkv_bias_pass``, the numpy reference
model's ``qkv += b`` and ``dqkv.sum(axis=0)``; Megatron-LM 2021/2022 under PyTorch 1.8:
matmul then ``output + bias``, ``grad_output.sum(dim=0)``): bytes derived by hand; the later
framework stacks add it in the GEMM's epilogue, so nothing is charged there
(ddlsim/data/software.yaml)."""

from types import SimpleNamespace

from ddlsim.software import resolve_software, stacks
from ddlsim.workloads.decoder.layerkernels import qkv_bias_kernels


def _shape(bias=True, mla=None):
    # GPT-2-like: hidden 512, 8 heads of 64, no grouped-query attention
    return SimpleNamespace(qkv_bias=bias, mla=mla, q_width=512, kv_width=512)


def test_the_pass_and_the_sum_over_the_qkv_output():
    sw = SimpleNamespace(qkv_bias_pass=True)
    tokens, t = 4 * 128, 2
    fwd, bwd = qkv_bias_kernels(_shape(), sw, tokens, t, 4, "fp32")
    n = tokens * 3 * 512 / t                    # the QKV output on one of 2 ranks
    assert [k.bytes for k in fwd] == [2 * 4 * n]    # read + write, fp32
    assert [k.bytes for k in bwd] == [4 * n]        # read
    assert all(k.kind == "memory" for k in (*fwd, *bwd))
    # no bias, or the bias in the GEMM: nothing
    assert qkv_bias_kernels(_shape(bias=False), sw, tokens, t, 4, "fp32") == ((), ())
    off = SimpleNamespace(qkv_bias_pass=False)
    assert qkv_bias_kernels(_shape(), off, tokens, t, 4, "fp32") == ((), ())


#: the stacks whose QKV linear adds its bias apart (software.yaml's sources)
APART = {"megatron-lm-2021", "deepspeed-2021"}


def test_which_framework_stacks_add_it_in_the_gemm():
    for name in stacks():
        assert resolve_software(name).qkv_bias_pass is (name in APART), name


def test_the_numpy_stack_adds_it_apart():
    from ddlsim.reference.machine import NUMPY_STACK
    from ddlsim.software import SoftwareSpec
    assert resolve_software(SoftwareSpec(**NUMPY_STACK)).qkv_bias_pass is True
