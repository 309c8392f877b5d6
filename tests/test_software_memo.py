"""``resolve_software`` resolves a stack once per spec and plan values
(:func:`ddlsim.software._resolved_key`): the same frozen object for equal inputs, the value a
fresh resolution gives, and a new one where a field it reads differs."""

import pytest

from ddlsim.config import ParallelConfig
from ddlsim.errors import ConfigError
from ddlsim.software import SoftwareSpec, _resolve, cache_clear, resolve_software


def _same(a, b):
    return (a.name, a.kernels, a.overlap, a.sources, a.what_if) == \
        (b.name, b.kernels, b.overlap, b.sources, b.what_if)


@pytest.mark.parametrize("spec", [None, "megatron-lm-2021",
                                  SoftwareSpec(stack="deepspeed"),
                                  SoftwareSpec(stack="megatron-core-2024",
                                               overlap={"overlap_grad_reduce": False})])
def test_equal_plans_share_one_resolution(spec):
    cache_clear()
    a = ParallelConfig(tensor_model_parallel_size=2)
    b = ParallelConfig(tensor_model_parallel_size=8, sequence_parallel=True)  # no stack field
    got = resolve_software(spec, a)
    assert resolve_software(spec, b) is got
    assert _same(got, _resolve(spec, b))


def test_a_stack_field_of_the_plan_resolves_anew():
    cache_clear()
    spec = SoftwareSpec(stack="megatron-core-2024")
    plain = resolve_software(spec, ParallelConfig())
    on = resolve_software(spec, ParallelConfig(overlap_grad_reduce=False))
    assert on is not plain
    assert on.overlap_grad_reduce is False
    assert _same(on, _resolve(spec, ParallelConfig(overlap_grad_reduce=False)))
    assert _same(plain, _resolve(spec, ParallelConfig()))


def test_equal_specs_apart_by_identity_and_cleared():
    cache_clear()
    one, two = SoftwareSpec(stack="deepspeed"), SoftwareSpec(stack="deepspeed")
    a = resolve_software(one, None)
    assert resolve_software(one, None) is a
    assert _same(resolve_software(two, None), a)
    cache_clear()
    assert resolve_software(one, None) is not a


def test_a_failure_is_raised_every_time():
    bad = SoftwareSpec(stack="megatron-core-2024",
                       overlap={"zero3_gather": "per_layer", "zero3_prefetch_modules": 2})
    for _ in range(2):
        with pytest.raises(ConfigError, match="zero3_prefetch_modules"):
            resolve_software(bad, None)
