"""The trace's payloads and ops are made by :func:`~ddlsim.workloads.payloads._quick_init`'s
``__init__`` (each field set through its slot, issue 27's sixth speed round): the same
parameters, defaults, checks and frozen objects as the dataclass's own ``__init__``."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from ddlsim.workloads import payloads
from ddlsim.workloads.payloads import (Collective, Compute, Contention, Kernel, Loop, Op, P2P,
                                       Wait, _quick_init)

CLASSES = [Kernel, Compute, Collective, Contention, P2P, Wait, Loop, Op]


def _generated(cls):
    """``cls`` made again as a plain frozen dataclass with slots (its generated
    ``__init__``), with the same fields, defaults and ``__post_init__``."""
    ns = {"__annotations__": {f.name: f.type for f in dataclasses.fields(cls)},
          "__module__": payloads.__name__}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            ns[f.name] = f.default
    if "__post_init__" in cls.__dict__:
        ns["__post_init__"] = cls.__dict__["__post_init__"]
    return dataclasses.dataclass(frozen=True, slots=True)(type(cls.__name__, (), ns))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_quick_init_takes_the_generated_inits_parameters(cls):
    assert inspect.signature(cls) == inspect.signature(_generated(cls))


EXAMPLES = [
    (Kernel, ("gemm", (4.0, 8.0, 16.0)), {"batch": 2.0, "accumulate_bytes": 4.0}),
    (Compute, ("mm", 1e9), {"kernels": (Kernel("memory", bytes=8.0),), "host_s": 1e-6}),
    (Collective, ("ar", "all_reduce", "dp", 1024.0), {"algorithm": "ring"}),
    (Contention, (1e9,), {"sms": 8}),
    (P2P, ("s", "send", "pp", 1, 64.0, "act"), {}),
    (Wait, ("w", "comm"), {}),
    (Loop, ("l", [Op(Wait("w", "comm"))], 3), {}),
    (Op, (Wait("w", "comm"),), {"stream": "comm", "deps": (0,), "repeat": 2}),
]


@pytest.mark.parametrize("cls, args, kwargs", EXAMPLES, ids=lambda x: getattr(x, "__name__", ""))
def test_quick_init_makes_the_generated_inits_object(cls, args, kwargs):
    """Field by field the same values (``__post_init__``'s normalising included: a loop's
    body as a tuple), frozen, and equal to one made by keyword."""
    got, want = cls(*args, **kwargs), _generated(cls)(*args, **kwargs)
    values = [getattr(got, f.name) for f in dataclasses.fields(cls)]
    assert values == [getattr(want, f.name) for f in dataclasses.fields(cls)]
    names = [p for p in inspect.signature(cls).parameters]
    assert cls(**dict(zip(names, args)), **kwargs) == got
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, dataclasses.fields(cls)[0].name, None)


@pytest.mark.parametrize("make, message", [
    (lambda: Kernel("conv"), "kernel kind must be gemm, flash or memory"),
    (lambda: Compute("x", 1.0, seconds=-1.0), "seconds must be finite and >= 0"),
    (lambda: Collective("c", "all_reduce", "dp", 8.0, split_by="sender"), "needs split_bytes"),
    (lambda: Loop("l", (), 2), "needs a body and count >= 1"),
])
def test_quick_init_still_checks_its_fields(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_quick_init_refuses_a_field_it_cannot_set_as_the_dataclass_would():
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        items: tuple = dataclasses.field(default_factory=tuple)

    with pytest.raises(TypeError, match="WithFactory.items"):
        _quick_init(WithFactory)
