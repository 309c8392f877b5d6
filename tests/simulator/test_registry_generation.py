"""An algorithm registered after a prediction is seen by the next one: the cost model's cache
of closed-form choices (``costs._CHOICES``) keys on the registries' generation."""

from __future__ import annotations

import pytest

from ddlsim.api import predict
from ddlsim.simulator.collectives import base, registry_generation
from ddlsim.simulator.collectives.base import register

EXAMPLE = "examples/wiki-gpt2-9ranks-ddp.yaml"   # MPI all-reduce, the cheapest algorithm picked


@pytest.fixture
def free_all_reduce():
    """An MPI all-reduce that takes a nanosecond, registered for the test and removed after."""
    key = ("all_reduce", "test_free")
    yield lambda: register(*key, backend="mpi")(lambda n, net: 1e-9)
    base._REGISTRY.pop(key, None)
    base._changed()


def test_an_algorithm_registered_after_a_predict_is_chosen(free_all_reduce):
    before = predict(EXAMPLE).iteration_time_s
    generation = registry_generation()
    free_all_reduce()
    assert registry_generation() != generation
    after = predict(EXAMPLE).iteration_time_s
    assert after < before   # the 9-rank all-reduce over 10 Gb/s NICs now costs nothing


def test_the_same_registries_give_the_same_choice():
    assert predict(EXAMPLE).iteration_time_s == predict(EXAMPLE).iteration_time_s
