"""The parallel plan as a device mesh of named axes.

A :class:`DeviceMesh` numbers ``world_size`` ranks by mixed-radix coordinates over named axes
listed innermost first: with Megatron-LM's default order ``tp-cp-ep-dp-pp``,
``rank = t + T·(c + C·(d + D·s))``. Every process-group family (tensor, context, data,
pipeline, the gradient group ``dp × cp``, …) is "the ranks that differ only along these axes",
computed once, vectorised, for any order.

Expert parallelism is carved out of the ranks inside one pipeline stage, as in Megatron-Core:
the same ranks are read through a second, *expert* layout whose axes are ``etp`` (expert
tensor parallel, in tp's slot of the order), ``ep`` (in ep's slot) and ``edp`` (expert data
parallel, in dp's slot), with ``pp`` unchanged and ``cp`` folded away, so that
``etp · ep · edp = tp · cp · dp`` and ``edp = tp · cp · dp / (etp · ep)``.

References
----------
Megatron-LM, ``megatron/core/parallel_state.py`` (NVIDIA/Megatron-LM, commit 00caa53a):
``RankGenerator`` and ``generate_masked_orthogonal_rank_groups`` (group layout
and row order for a masked set of axes), and ``initialize_model_parallel`` (default
``order="tp-cp-ep-dp-pp"``; the expert generator built with ``tp=expert_tensor_parallel_size,
ep=expert_model_parallel_size, dp=world/(etp·ep·pp), cp=1`` over the same order; the check that
its pipeline groups equal the dense ones).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

import numpy as np

from ddlsim.errors import ConfigError
from ddlsim.workloads.trace import GroupFamily, GroupKind

__all__ = ["DeviceMesh", "AXES", "EXPERT_AXES", "MEGATRON_ORDER", "MEGATRON_ALIASES"]

#: Axes of the dense layout, with the group kind each one's family reports.
AXES: Mapping[str, GroupKind] = MappingProxyType(
    {"tp": "tp", "cp": "cp", "ep": "ep", "dp": "dp", "pp": "pp"})
#: Axes only the expert layout has (``ep`` and ``pp`` are shared with the dense one).
EXPERT_AXES: Mapping[str, GroupKind] = MappingProxyType({"etp": "tp", "edp": "dp"})
#: Megatron-Core's default rank order, innermost first.
MEGATRON_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
#: Megatron-LM argument names and the mesh axis each one sizes.
MEGATRON_ALIASES: Mapping[str, str] = MappingProxyType({
    "tensor_model_parallel_size": "tp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "data_parallel_size": "dp",
    "pipeline_model_parallel_size": "pp", "expert_tensor_parallel_size": "etp"})
_SIZE_KEYS = (*AXES, "etp")


class _Layout:
    """Ranks ``0..prod(sizes)-1`` numbered mixed-radix over ``names`` (innermost first)."""

    def __init__(self, names: tuple[str, ...], sizes: tuple[int, ...]):
        self.names, self.sizes = names, sizes
        self.strides = np.cumprod((1, *sizes[:-1]), dtype=np.int64)
        self.world = math.prod(sizes)

    def coords(self, ranks: np.ndarray, axes: tuple[str, ...]) -> np.ndarray:
        i = [self.names.index(a) for a in axes]
        return (ranks[..., None] // self.strides[i]) % np.asarray(self.sizes, np.int64)[i]

    def rank_of(self, coords: np.ndarray, axes: tuple[str, ...]) -> np.ndarray:
        return coords @ self.strides[[self.names.index(a) for a in axes]]

    @cached_property
    def _ranks(self) -> np.ndarray:
        """Every rank at its coordinates: C order, so the innermost axis is the last array
        axis (read-only; each family of the layout is a transpose of it)."""
        r = np.arange(self.world, dtype=np.int64).reshape(self.sizes[::-1])
        r.setflags(write=False)
        return r

    def groups(self, axes: Iterable[str]) -> np.ndarray:
        """Megatron's ``generate_masked_orthogonal_rank_groups``, vectorised: members vary
        the masked axes (innermost fastest); rows enumerate the others (innermost fastest)."""
        axes = set(axes)
        last = len(self.names) - 1
        masked = [last - i for i, n in enumerate(self.names) if n in axes]
        others = [last - i for i, n in enumerate(self.names) if n not in axes]
        size = math.prod(self.sizes[last - i] for i in masked)
        return self._ranks.transpose(others[::-1] + masked[::-1]).reshape(self.world // size,
                                                                           size)


@dataclass(frozen=True)
class DeviceMesh:
    """Named parallel axes, their sizes and their order (innermost first).

    Build one with :meth:`of` or :meth:`from_megatron`; the constructor checks its fields.

    Parameters
    ----------
    order : tuple of str
        A permutation of ``tp, cp, ep, dp, pp``, innermost (fastest-varying rank) first.
    shape : tuple of int
        The size of each axis of ``order``; ``dp`` is the dense data-parallel size and ``ep``
        is carved out of ``tp · cp · dp`` (it does not multiply the world size).
    expert_tensor : int
        Expert tensor-parallel size ``etp`` (Megatron's default: the tp size).
    """

    order: tuple[str, ...]
    shape: tuple[int, ...]
    expert_tensor: int

    def __post_init__(self) -> None:
        if len(self.order) != len(self.shape):
            raise ConfigError(f"parallel plan: order {self.order} and shape {self.shape} must "
                              f"have one size per axis.")
        n = dict(zip(self.order, self.shape))
        _check_order(self.order, n, full=True)
        for name, k in (*n.items(), ("etp", self.expert_tensor)):
            _check_size(name, k)
        inner = math.prod(self.shape) // (n["ep"] * n["pp"])  # tp · cp · dp
        carve = n["ep"] * self.expert_tensor
        if inner % carve:
            raise ConfigError(
                f"parallel plan: expert_model_parallel_size × expert_tensor_parallel_size = "
                f"{self.size('ep')} × {self.expert_tensor} = {carve} must divide the ranks of "
                f"one pipeline stage, tensor × context × data = {self.size('tp')} × "
                f"{self.size('cp')} × {self.size('dp')} = {inner}; choose ep and etp whose "
                f"product divides {inner}.")
        plain = n["cp"] == n["ep"] == 1 and self.expert_tensor == n["tp"]  # one layout
        if not plain and not np.array_equal(self._dense.groups(("pp",)),
                                            self._expert.groups(("pp",))):
            raise ConfigError(
                f"parallel plan: order {'-'.join(self.order)} puts pipeline stages in different "
                f"places for dense and expert layers (expert data parallel {self.size('edp')} ≠ "
                f"data parallel {self.size('dp')}); put pp last, as in Megatron's "
                f"{'-'.join(MEGATRON_ORDER)}, or choose ep·etp = tp·cp.")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def of(cls, sizes: Mapping[str, int], order: Iterable[str] | str = MEGATRON_ORDER
           ) -> DeviceMesh:
        """A mesh from axis sizes (short names or Megatron argument names) and an order.

        Parameters
        ----------
        sizes : mapping of str to int
            Sizes of ``tp, cp, ep, dp, pp`` and optionally ``etp`` (default: tp), or of the
            Megatron names in :data:`MEGATRON_ALIASES`; missing axes have size 1.
        order : iterable of str or str
            Innermost first, as a sequence or dash-joined (``"tp-cp-ep-dp-pp"``). Axes of size
            1 may be left out (appended, as Megatron's ``RankGenerator`` does); an axis of
            size > 1 must be listed. ``etp`` and ``edp`` take tp's and dp's places.

        Returns
        -------
        DeviceMesh

        Raises
        ------
        ConfigError
            Unknown axis names (with the closest known one), sizes < 1, an order that repeats
            or misses an axis, ep·etp not dividing tp·cp·dp, or an order that moves pipeline
            stages between dense and expert layers.
        """
        canon = _canonical_sizes(sizes)
        order = tuple(order.split("-")) if isinstance(order, str) else tuple(order)
        _check_order(order, canon, full=False)
        order = order + tuple(a for a in MEGATRON_ORDER if a not in order)
        etp = canon.get("etp", canon.get("tp", 1))
        return cls(order, tuple(canon.get(a, 1) for a in order), etp)

    @classmethod
    def from_megatron(cls, tensor_model_parallel_size: int = 1,
                      pipeline_model_parallel_size: int = 1, data_parallel_size: int = 1,
                      context_parallel_size: int = 1, expert_model_parallel_size: int = 1,
                      expert_tensor_parallel_size: int | None = None,
                      order: Iterable[str] | str = MEGATRON_ORDER) -> DeviceMesh:
        """The mesh of Megatron-LM's arguments (``initialize_model_parallel``), default order
        ``tp-cp-ep-dp-pp``; ``expert_tensor_parallel_size=None`` means the tp size."""
        sizes = {"tp": tensor_model_parallel_size, "pp": pipeline_model_parallel_size,
                 "dp": data_parallel_size, "cp": context_parallel_size,
                 "ep": expert_model_parallel_size}
        if expert_tensor_parallel_size is not None:
            sizes["etp"] = expert_tensor_parallel_size
        return cls.of(sizes, order)

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        """Number of ranks: ``tp · cp · dp · pp`` (ep is carved out, not multiplied in)."""
        return self._dense.world

    @cached_property
    def sizes(self) -> Mapping[str, int]:
        """Every axis size, dense and expert: ``tp cp ep dp pp etp edp``; made once per mesh
        (a frozen one), read by every :meth:`size` (a search grid's plan resolutions)."""
        out = dict(zip(self.order, self.shape))
        out["etp"] = self.expert_tensor
        out["edp"] = self.world_size // (out["pp"] * out["ep"] * self.expert_tensor)
        return MappingProxyType(out)

    def size(self, axis: str) -> int:
        """Size of one axis (dense or expert)."""
        _check_axes((axis,))
        return self.sizes[axis]

    def __str__(self) -> str:
        s = self.sizes
        dense = " ".join(f"{a}={s[a]}" for a in self.order if a != "ep")
        return (f"mesh {dense} | ep={s['ep']} etp={s['etp']} edp={s['edp']} "
                f"(order {'-'.join(self.order)}, {self.world_size} ranks)")

    # ------------------------------------------------------------------ layouts
    @cached_property
    def _dense(self) -> _Layout:
        keep = [i for i, a in enumerate(self.order) if a != "ep"]
        return _Layout(tuple(self.order[i] for i in keep), tuple(self.shape[i] for i in keep))

    @cached_property
    def _expert(self) -> _Layout:
        s = self.sizes
        rename = {"tp": "etp", "dp": "edp", "ep": "ep", "pp": "pp"}
        names = tuple(rename[a] for a in self.order if a != "cp")
        return _Layout(names, tuple(s[a] for a in names))

    def _layout(self, axes: tuple[str, ...]) -> _Layout:
        _check_axes(axes)
        expert = [a for a in axes if a in ("etp", "edp", "ep")]
        dense = [a for a in axes if a in ("tp", "cp", "dp")]
        if expert and dense:
            raise ConfigError(
                f"mesh axes {list(axes)}: {dense} are axes of the dense layout and {expert} of "
                f"the expert layout; one group takes axes of one layout (dense: tp cp dp pp; "
                f"expert: etp ep edp pp).")
        return self._expert if expert else self._dense

    # ------------------------------------------------------------------ ranks
    def coords(self, rank, axes: Iterable[str] | None = None) -> np.ndarray:
        """Coordinates of ``rank`` (int or array) along ``axes`` (default: the dense axes in
        order, innermost first), as an int array of shape ``rank.shape + (len(axes),)``."""
        axes = self._default_axes(axes)
        r = np.asarray(rank, dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.world_size):
            raise ConfigError(f"mesh: rank {r.min() if r.min() < 0 else r.max()} is outside "
                              f"0..{self.world_size - 1} of {self}.")
        return self._layout(axes).coords(r, axes)

    def rank_of(self, coords, axes: Iterable[str] | None = None) -> np.ndarray:
        """The rank at ``coords`` (last dimension along ``axes``, as :meth:`coords` returns);
        all axes of the layout must be given."""
        axes = self._default_axes(axes)
        layout = self._layout(axes)
        c = np.asarray(coords, dtype=np.int64)
        missing = [a for a in layout.names if a not in axes and self.size(a) > 1]
        if missing or c.shape[-1:] != (len(axes),):
            raise ConfigError(f"mesh: coordinates of shape {c.shape} along {list(axes)} do not "
                              f"name one rank; give one column per axis of "
                              f"{list(layout.names)} (missing {missing}).")
        hi = np.asarray([self.size(a) for a in axes])
        if c.size and ((c < 0) | (c >= hi)).any():
            raise ConfigError(f"mesh: coordinates along {list(axes)} must lie in 0..size-1 "
                              f"with sizes {hi.tolist()}; got {c.tolist()}.")
        return layout.rank_of(c, axes)

    def _default_axes(self, axes: Iterable[str] | None) -> tuple[str, ...]:
        if axes is None:
            return self._dense.names
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        if len(set(axes)) != len(axes):
            raise ConfigError(f"mesh: axes {list(axes)} must name each axis once.")
        return axes

    # ------------------------------------------------------------------ groups
    def groups(self, axes: Iterable[str] | str) -> np.ndarray:
        """Process groups whose members differ only along ``axes``.

        Parameters
        ----------
        axes : str or iterable of str
            Axes of one layout: dense ``tp cp dp pp`` or expert ``etp ep edp pp``; e.g.
            ``("dp", "cp")`` is the gradient group under context parallelism, ``("edp",)``
            the expert gradient group.

        Returns
        -------
        numpy.ndarray, shape (n_groups, group_size)
            Read-only. Within a row, ranks vary the given axes innermost first, whatever order
            ``axes`` lists them in; rows enumerate the other axes innermost first, the layout
            of Megatron-Core's ``generate_masked_orthogonal_rank_groups``.
        """
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        if not axes or len(set(axes)) != len(axes):
            raise ConfigError(f"mesh groups: axes {list(axes)} must name at least one axis, "
                              f"each once.")
        out = np.ascontiguousarray(self._layout(axes).groups(axes))
        out.setflags(write=False)
        return out

    def family(self, name: str, kind: GroupKind, axes: Iterable[str] | str) -> GroupFamily:
        """The :class:`~ddlsim.workloads.trace.GroupFamily` ``name`` of :meth:`groups` (axes)."""
        return GroupFamily(name, kind, self.groups(axes))

    def families(self) -> dict[str, GroupFamily]:
        """The standard families: ``tp dp pp`` always; ``cp`` and ``dp_cp`` (the gradient
        group) when cp > 1. When the expert layout differs from the dense one (ep > 1, or
        etp ≠ tp): ``ep`` when ep > 1, ``etp`` (an expert's tensor-parallel ranks) when
        etp > 1, ``tp_ep`` (Megatron-Core's ``tp_ep`` group, etp × ep: the allgather
        dispatcher's) when etp·ep > 1, and ``edp`` (expert gradients). Otherwise those
        groups are ``tp``, ``tp`` and the gradient group."""
        out = {n: self.family(n, AXES[n], n) for n in ("tp", "dp", "pp")}
        s = self.sizes
        if s["cp"] > 1:
            out["cp"] = self.family("cp", "cp", "cp")
            out["dp_cp"] = self.family("dp_cp", "dp", ("dp", "cp"))
        if s["ep"] == 1 and s["etp"] == s["tp"]:
            return out   # one layout: the expert groups are the dense ones (tp, dp × cp)
        if s["ep"] > 1:
            out["ep"] = self.family("ep", "ep", "ep")
        if s["etp"] > 1:
            out["etp"] = self.family("etp", "tp", "etp")
        if s["etp"] * s["ep"] > 1:
            out["tp_ep"] = self.family("tp_ep", "ep", ("etp", "ep"))
        out["edp"] = self.family("edp", "dp", "edp")
        return out


# ---------------------------------------------------------------------- validation
def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_axes(axes: Iterable[str]) -> None:
    known = (*AXES, *EXPERT_AXES)
    for a in axes:
        if a not in known:
            raise ConfigError(f"mesh axis {a!r} is unknown{_suggest(str(a), known)}; the axes "
                              f"are {', '.join(known)}.")


def _check_size(name: str, n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ConfigError(f"parallel plan: the size of axis {name!r} is {n!r}; it must be an "
                          f"integer ≥ 1.")


def _canonical_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
    """Sizes keyed by short axis names; Megatron argument names are accepted as aliases."""
    out: dict[str, int] = {}
    given: dict[str, str] = {}
    known = (*_SIZE_KEYS, *MEGATRON_ALIASES)
    for key, n in sizes.items():
        axis = MEGATRON_ALIASES.get(key, key)
        if axis not in _SIZE_KEYS:
            raise ConfigError(f"parallel plan: axis {key!r} is unknown{_suggest(str(key), known)}"
                              f"; the axes are {', '.join(_SIZE_KEYS)} (or Megatron's "
                              f"{', '.join(MEGATRON_ALIASES)}).")
        if axis in out:
            raise ConfigError(f"parallel plan: axis {axis!r} is sized twice, as "
                              f"{given[axis]!r} and as {key!r}; give it once.")
        _check_size(key, n)
        out[axis], given[axis] = int(n), key
    return out


def _check_order(order: tuple[str, ...], sizes: Mapping[str, int], full: bool) -> None:
    for a in order:
        if a not in AXES:
            hint = (" (etp and edp take tp's and dp's places)" if a in EXPERT_AXES
                    else _suggest(str(a), AXES))
            raise ConfigError(f"parallel plan: order {'-'.join(map(str, order))} names "
                              f"{a!r}{hint}; the order lists {', '.join(AXES)}, innermost first.")
    repeated = sorted({a for a in order if order.count(a) > 1})
    missing = [a for a in AXES if a not in order and (full or sizes.get(a, 1) > 1)]
    if repeated or missing:
        raise ConfigError(f"parallel plan: order {'-'.join(order)} must list each of "
                          f"{', '.join(AXES)} once (axes of size 1 may be left out); repeated: "
                          f"{repeated or 'none'}, missing: {missing or 'none'}.")
