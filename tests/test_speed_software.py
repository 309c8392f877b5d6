"""A resolved software stack reads its fields as plain attributes (issue 27, speed): a search
grid reads ~5,000 of them, and each used to be a failed look-up before ``__getattr__``."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from ddlsim.software import Software, resolve_software


def test_every_field_is_an_attribute_of_its_own():
    """Every kernels/overlap field sits in the instance's own attributes, with the value
    the stack resolved, so reading it never reaches ``__getattr__``."""
    sw = resolve_software("megatron-core-2025")
    own = vars(sw)
    for part in (sw.kernels, sw.overlap):
        for field, value in part.items():
            assert field in own, field
            assert own[field] == value and getattr(sw, field) == value


def test_kernels_win_over_overlap_and_the_class_names_keep_their_meaning():
    """A field in both parts reads as the kernels' (as ``__getattr__`` searched them); one
    named like a dataclass field or a method does not shadow it."""
    sw = Software("x", {"both": 1, "name": "k", "__hash__": 0}, {"both": 2, "only": 3}, {})
    assert (sw.both, sw.only, sw.name) == (1, 3, "x")
    assert isinstance(hash(sw), int)
    with pytest.raises(AttributeError):
        sw.missing


def test_a_stack_copies_pickles_and_replaces():
    """Copies, pickles and ``dataclasses.replace`` keep every field (a copy used to recurse
    through ``__getattr__`` before its fields were set)."""
    sw = resolve_software("torchtitan-2025")
    for other in (copy.deepcopy(sw), copy.copy(sw), pickle.loads(pickle.dumps(sw)),
                  dataclasses.replace(sw, what_if=True)):
        assert other.kernels == sw.kernels and other.overlap == sw.overlap
        assert all(getattr(other, f) == v for f, v in {**sw.overlap, **sw.kernels}.items())
    assert pickle.loads(pickle.dumps(sw)) == sw
