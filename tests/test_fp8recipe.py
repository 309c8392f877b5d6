"""FP8 recipes' scaling and cast passes (ddlsim/simulator/kernels/fp8recipe.py), by hand from
pytorch/ao's roofline model (torchao/testing/float8/roofline_utils.py at 6243040)."""

from __future__ import annotations

import pytest

from ddlsim.simulator.kernels.fp8recipe import FP8_RECIPES, fp8_cast_kernels
from ddlsim.software import SoftwareSpec, resolve_software

M, N, K = 8192.0, 4096.0, 14336.0


def total(recipe, compiled=False):
    return sum(k.bytes for bwd in (False, True)
               for k in fp8_cast_kernels(recipe, M, N, K, bwd, compiled))


@pytest.mark.parametrize("recipe, by_hand", [
    # TE delayed scaling: cast_transpose of x and g (2 + 1 + 1), cast of w (2 + 1)
    ("te_delayed", 4 * M * K + 3 * K * N + 4 * M * N),
    # tensorwise: amax read + cast to both layouts for x and g (2 + 4), w: amax + two casts
    ("tensorwise", 6 * M * K + 8 * K * N + 6 * M * N),
    # rowwise: x and g: cast + bf16 transpose (5), transpose's cast (3); w: 3 + 4 + 3
    ("rowwise", 8 * M * K + 10 * K * N + 8 * M * N),
])
def test_bytes_per_linear_by_hand(recipe, by_hand):
    assert total(recipe) == pytest.approx(by_hand, rel=1e-12)


def test_compiling_fuses_the_first_read_of_input_and_output_gradient():
    assert total("tensorwise") - total("tensorwise", True) == pytest.approx(2 * M * K + 2 * M * N)
    assert total("rowwise") - total("rowwise", True) == pytest.approx(2 * M * K + 2 * M * N)
    assert total("te_delayed", True) == total("te_delayed")


def test_rowwise_moves_more_than_tensorwise_which_moves_more_than_te():
    assert total("rowwise") > total("tensorwise") > total("te_delayed")


def test_every_stack_names_a_registered_recipe():
    from ddlsim.software import stacks
    for name in stacks():
        assert resolve_software(name).fp8_recipe in FP8_RECIPES
    sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", kernels={"fp8_recipe": "rowwise"}))
    assert sw.fp8_recipe == "rowwise"


# --- the recipes' GEMM kernels, rescale passes and per-module casts (torchao 6243040) -------

from ddlsim.simulator.kernels.fp8recipe import (FP8_GEMM_KERNELS, fp8_gemm_variants,  # noqa: E402
                                                fp8_rescale_kernels)
from ddlsim.workloads.decoder.layerkernels import _linear  # noqa: E402


def test_gemm_kernels_follow_the_accumulation_and_scaling_of_each_gemm():
    # forward fast-accumulated, backward split accumulator; rowwise's forward in CUTLASS
    assert fp8_gemm_variants("tensorwise", False) == ("cublas_fast",)
    assert fp8_gemm_variants("tensorwise", True) == ("cublas_split", "cublas_split")
    assert fp8_gemm_variants("rowwise", False) == ("cutlass_rowwise",)
    assert fp8_gemm_variants("rowwise", True) == ("cublas_split", "cublas_split")
    assert fp8_gemm_variants("te_delayed", True) == ("cublas_split", "cublas_split")
    # the device's FP8 ceiling is MAMF's, cuBLAS with the split accumulator
    assert FP8_GEMM_KERNELS["cublas_split"] == 1.0
    assert FP8_GEMM_KERNELS["cutlass_rowwise"] == 0.95


def test_rowwise_rescales_both_backward_outputs_and_the_others_none():
    # grad_input M x K and grad_weight K x N, bf16 read + written: 4 bytes per element
    assert sum(k.bytes for k in fp8_rescale_kernels("rowwise", M, N, K)) == \
        pytest.approx(4 * M * K + 4 * K * N)
    assert fp8_rescale_kernels("tensorwise", M, N, K) == ()
    assert fp8_rescale_kernels("te_delayed", M, N, K) == ()
    bwd = _linear((M, N, K), "fp8", True, "rowwise", True)
    assert [k.kind for k in bwd][-2:] == ["memory", "memory"]     # compiled too


def test_the_cast_of_an_input_shared_by_modules_runs_once_when_compiled():
    x_passes = 4 * M * K            # tensorwise, compiled: the input's cast (amax fused before)
    q, kv = (M, 1024.0, K), (M, 128.0, K)
    one = sum(k.bytes for k in _linear((q, kv, kv), "fp8", False, "tensorwise", True, True)
              if k.kind == "memory")
    each = sum(k.bytes for k in _linear((q, kv, kv), "fp8", False, "tensorwise", True, False)
               if k.kind == "memory")
    assert each - one == pytest.approx(2 * x_passes)
    eager = sum(k.bytes for k in _linear((q, kv, kv), "fp8", False, "tensorwise", False, True)
                if k.kind == "memory")
    assert eager == pytest.approx(each + 3 * 2 * M * K)    # eager: each module's amax read too


def test_torchao_recipes_run_one_gemm_per_module_and_te_one_fused_projection():
    import ddlsim
    from ddlsim.workloads.decoder.layerkernels import layer_kernels
    import warnings

    from ddlsim.errors import DDLSimWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DDLSimWarning)
        shape = ddlsim.load_config({
            "model": {"preset": "llama-3.1-70b"}, "parallel": {"tensor_model_parallel_size": 8},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 8192},
            "system": {"preset": "grand-teton-h100"}}).model.shape()
    counts = {}
    for recipe in ("tensorwise", "rowwise", "te_delayed"):
        # Transformer Engine's recipe on a model of fused projections (Megatron's layout;
        # torchtitan's own modules are separate: separate_projections)
        sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", kernels={
            "fp8_recipe": recipe, "separate_projections": recipe != "te_delayed"}))
        ks = layer_kernels(shape, sw, 1, 8192, 8, True, "fp8")
        counts[recipe] = [[k.shape[1] for k in ks[part] if k.kind == "gemm"]
                          for part in ("attn.qkv", "mlp.fc1")]
    # Llama 3.1 70B on TP 8: wq 64 x 128 / 8 = 1024 columns, wk and wv 8 x 128 / 8 = 128;
    # w1 and w3 28672 / 8 = 3584 each
    assert counts["tensorwise"] == counts["rowwise"] == [[1024, 128, 128], [3584, 3584]]
    assert counts["te_delayed"] == [[1280], [7168]]


def test_selective_recompute_redoes_the_per_module_fp8_linears():
    # torchtitan's op-level AC under FP8 recomputes every linear GEMM (sac.py): with torchao's
    # recipes that is one GEMM per module, wq wk wv wo w1 w3 w2; a compiled block drops w2's,
    # whose output the backward does not need (early_stop.py)
    import warnings

    import ddlsim
    from ddlsim.errors import DDLSimWarning
    from ddlsim.workloads.decoder.layerkernels import layer_kernels
    from ddlsim.workloads.decoder.sac import every_second_mm_op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DDLSimWarning)
        shape = ddlsim.load_config({
            "model": {"preset": "llama-3.1-8b"}, "parallel": {},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192},
            "system": {"preset": "grand-teton-h100"}}).model.shape()
    for recipe, compiled, n in (("tensorwise", False, 7), ("tensorwise", True, 6),
                                ("te_delayed", True, 3)):
        sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", compile=compiled,
                                           kernels={"fp8_recipe": recipe}))
        ks = layer_kernels(shape, sw, 1, 8192, 1, False, "fp8")
        op = every_second_mm_op(shape, ks, 1, 8192, 1, "bf16", "fp8", sw)
        assert len([k for k in op.kernels if k.kind == "gemm"]) == n


def test_compiled_torchao_casts_that_write_a_transpose_run_at_inductors_measured_bandwidth():
    from ddlsim.simulator.kernels.fp8recipe import FP8_PASS_KERNELS, fp8_pass_efficiency
    # pytorch/pytorch#133242: ~1.4 TB/s for the cast + transpose, ~2.2 for the other casts
    assert fp8_pass_efficiency("inductor_transpose") == pytest.approx(1.4 / 2.2)
    assert fp8_pass_efficiency("") == 1.0
    assert list(FP8_PASS_KERNELS) == ["inductor_transpose", "inductor_rowwise",
                                      "inductor_rowwise_transpose"]

    def slow(recipe, compiled):
        return sum(k.bytes for bwd in (False, True)
                   for k in fp8_cast_kernels(recipe, M, N, K, bwd, compiled)
                   if k.variant == "inductor_transpose")
    # tensorwise: x and g cast to both layouts (4 B each), w's backward cast (3 B)
    assert slow("tensorwise", True) == pytest.approx(4 * M * K + 4 * M * N + 3 * K * N)
    # rowwise: w's bf16 transpose (4 B); its x and g passes take the fitted rowwise kernels
    assert slow("rowwise", True) == pytest.approx(4 * K * N)
    # eager ops and Transformer Engine's own cast-transpose kernel: no such pass
    assert slow("tensorwise", False) == slow("te_delayed", True) == 0


def test_a_slower_pass_takes_longer_by_its_bandwidth_share():
    from ddlsim.simulator.kernels.device import KernelDevice, kernel_time
    from ddlsim.workloads.trace import Kernel
    dev = KernelDevice({"bf16": 1e15}, 2e12, None, {}, {})
    plain = kernel_time(Kernel("memory", bytes=1e9), dev)
    slow = kernel_time(Kernel("memory", bytes=1e9, variant="inductor_transpose"), dev)
    assert plain == pytest.approx(1e9 / 2e12)
    assert slow == pytest.approx(plain * 2.2 / 1.4)


def test_compiled_rowwise_input_and_gradient_passes_and_rescales_take_the_fitted_share():
    # ROWWISE_PASS_SHARE is fitted to torchao's LayerNorm -> Linear -> Sigmoid table
    # (benchmarks/fit_fp8_rowwise_passes.py); it applies to x and g passes (the transposing
    # ones at the transposing share too) and to the rescales, never to the weight's passes
    from ddlsim.simulator.kernels.fp8recipe import (ROWWISE_PASS_SHARE, fp8_pass_efficiency,
                                                    fp8_rescale_kernels)
    kinds = {}
    for bwd in (False, True):
        for k in fp8_cast_kernels("rowwise", M, N, K, bwd, True):
            kinds[k.variant] = kinds.get(k.variant, 0) + k.bytes
    assert kinds == {"inductor_rowwise_transpose": pytest.approx(3 * M * K + 3 * M * N),
                     "inductor_rowwise": pytest.approx(3 * M * N + 3 * M * K),
                     "inductor_transpose": pytest.approx(4 * K * N),
                     "": pytest.approx(3 * K * N + 3 * K * N)}
    assert fp8_pass_efficiency("inductor_rowwise") == ROWWISE_PASS_SHARE
    assert fp8_pass_efficiency("inductor_rowwise_transpose") == pytest.approx(
        ROWWISE_PASS_SHARE * 1.4 / 2.2)
    assert {k.variant for k in fp8_rescale_kernels("rowwise", M, N, K)} == {"inductor_rowwise"}
    # eager: no Inductor kernels, so no share of theirs on the casts
    assert {k.variant for bwd in (False, True)
            for k in fp8_cast_kernels("rowwise", M, N, K, bwd, False)} == {""}
    # tensorwise keeps its kernels
    assert "inductor_rowwise" not in {k.variant for bwd in (False, True)
                                      for k in fp8_cast_kernels("tensorwise", M, N, K, bwd, True)}


def test_the_fitted_share_is_what_its_script_fits():
    # the share minimises the fit shapes' mean |error| on the script's 0.01 grid (checked at
    # its neighbours, not by re-running the whole search) and improves the held-out shapes
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import fit_fp8_rowwise_passes as ff
    import validate_fp8_linear as vf
    from ddlsim.simulator.kernels.fp8recipe import ROWWISE_PASS_SHARE as share
    dev, sw = vf.device_and_stack()
    fit_rows, held = ff.shapes()
    here, below, above = (ff.mean_abs(ff.errors(x, fit_rows, dev, sw))
                          for x in (share, round(share - 0.01, 2), round(share + 0.01, 2)))
    assert here < below and here < above
    assert ff.mean_abs(ff.errors(share, held, dev, sw)) < ff.mean_abs(
        ff.errors(1.0, held, dev, sw))
