"""The spatial grid: process groups, rank classes by grid position, halo messages.

Each sample's volume is split over the ``px × py × pz`` ranks of one spatial group, the
tensor-model-parallel axis of the plan's :class:`~ddlsim.workloads.mesh.DeviceMesh`
(innermost in Megatron's order, so a spatial group is consecutive ranks, as the proxy's
``model_parallel_comm``, cosmoflow.cpp:149). A rank's member index ``i`` in its group is its
grid position, x fastest: ``i = x + px·(y + py·z)`` (the proxy's neighbours ``rank^1`` and
``rank^2`` are its x and y neighbours, cosmoflow.cpp:75-76).

Group families: ``sp`` (the spatial group: all-gather / reduce-scatter of the dense
layers), ``sx`` ``sy`` ``sz`` (the lines of the grid along each split axis: halo sends and
receives to member ``±1``), ``dp`` (ranks at the same grid position of every replica: the
dense-gradient all-reduce) and ``world`` (the conv-gradient all-reduce).

Padding is ``'same'``, not periodic: a rank at the low (high) end of an axis has no lower
(upper) neighbour there. The ranks at one grid coordinate (one per replica) form a rank class:
one class per grid coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import P2P, GroupFamily, Op
from .shapes import face_elements, halo_widths

__all__ = ["AXES", "Position", "grid_families", "positions", "halo_ops"]

AXES = "xyz"


@dataclass(frozen=True, slots=True)
class Position:
    """Which neighbours a class's ranks have: per axis ``(lower, upper)``."""

    sides: tuple[tuple[bool, bool], tuple[bool, bool], tuple[bool, bool]]

    def interior_fraction(self, local: tuple[int, ...], widths: tuple[int, int]) -> float:
        """The share of a local volume whose stencil needs no halo from a neighbour."""
        frac = 1.0
        for n, (lo, hi) in zip(local, self.sides):
            frac *= max(n - lo * widths[0] - hi * widths[1], 0) / n
        return frac


def grid_families(mesh, grid: tuple[int, int, int]) -> dict[str, GroupFamily]:
    """``sp``, ``sx``/``sy``/``sz`` (split axes only), ``dp`` and ``world`` of a mesh whose
    tensor-parallel axis holds the ``grid``."""
    sp = mesh.groups("tp")
    px, py, pz = grid
    cube = sp.reshape(-1, pz, py, px)
    out = {"sp": GroupFamily("sp", "tp", sp)}
    lines = {"x": cube, "y": cube.transpose(0, 1, 3, 2), "z": cube.transpose(0, 2, 3, 1)}
    for axis, p in zip(AXES, grid):
        if p > 1:
            out[f"s{axis}"] = GroupFamily(f"s{axis}", "tp", lines[axis].reshape(-1, p))
    out["dp"] = GroupFamily("dp", "dp", mesh.groups("dp"))
    out["world"] = GroupFamily("world", "dp", np.arange(mesh.world_size)[None, :])
    return out


def positions(mesh, grid: tuple[int, int, int]) -> list[tuple[str, Position, tuple[int, ...]]]:
    """The rank classes: one per grid coordinate (the same coordinate in every replica), x
    fastest, each as (name, neighbours, ranks). A class per coordinate, not per kind of
    position, so that every rank of a class has its ``±1`` neighbours in one class (the
    analytical engine resolves a class's peers through one representative rank)."""
    sp = mesh.groups("tp")
    px, py, pz = grid
    out = []
    for i in range(sp.shape[1]):
        xyz = (i % px, i // px % py, i // (px * py))
        sides = tuple((c > 0, c < p - 1) for c, p in zip(xyz, grid))
        name = ".".join(f"{a}{c}" for a, c, p in zip(AXES, xyz, grid) if p > 1) or "all"
        out.append((name, Position(sides), tuple(sorted(sp[:, i].tolist()))))
    return out


def halo_ops(pos: Position, name: str, local: tuple[int, ...], channels: int, batch: int,
             kernel: int, dtype_bytes: int, backward: bool, deps: tuple[int, ...]) -> list[Op]:
    """The isends then irecvs of one halo exchange of a rank at ``pos`` (the order of
    cosmoflow.cpp:75-78), each after ``deps`` (block indices).

    Forward, a rank receives ``before`` planes from its lower neighbour and ``after`` planes
    from its upper one (and sends them the mirror); the data gradient needs the transpose,
    so the backward swaps the two widths. Faces of zero planes are not sent.
    """
    before, after = halo_widths(kernel)
    if backward:
        before, after = after, before
    sends, recvs = [], []
    for axis, (lo, hi) in enumerate(pos.sides):
        fam = f"s{AXES[axis]}"
        # (neighbour present, peer, planes sent to it, planes received from it, tag direction)
        for present, peer, out_w, in_w, d in ((lo, -1, after, before, "-"),
                                              (hi, +1, before, after, "+")):
            if not present:
                continue
            tag_out = f"{name}.{AXES[axis]}{d}"
            tag_in = f"{name}.{AXES[axis]}{'+' if d == '-' else '-'}"
            if out_w:
                n = face_elements(local, axis, out_w, channels, batch) * dtype_bytes
                sends.append(P2P(f"{name}.isend.{AXES[axis]}{d}", "send", fam, peer, n, tag_out))
            if in_w:
                n = face_elements(local, axis, in_w, channels, batch) * dtype_bytes
                recvs.append(P2P(f"{name}.irecv.{AXES[axis]}{d}", "recv", fam, peer, n, tag_in))
    return [Op(p, stream="halo", deps=deps) for p in sends + recvs]
