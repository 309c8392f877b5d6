"""Process groups along the axes of a tensor-parallel grid laid over the mesh's ``tp`` axis.

The ``p`` ranks of each ``tp`` group (consecutive under Megatron's order) are read as a grid
of ``dims`` (outermost first, the last axis varying fastest); the group family of one grid axis
holds the ranks that differ only along it. With the default order the innermost grid axis is
inside a node, the others may span nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...trace import GroupFamily

__all__ = ["grid_families"]


def grid_families(mesh: Any, dims: tuple[int, ...], names: tuple[str, ...]) -> dict:
    """``{name: GroupFamily}`` for each grid axis of size > 1 (kind ``tp``).

    Parameters
    ----------
    mesh : DeviceMesh
    dims : sizes of the grid axes, outermost first; their product is the tp size.
    names : one family name per axis of ``dims``.
    """
    tp = mesh.groups("tp")
    grid = tp.reshape(tp.shape[0], *dims)
    out = {}
    for axis, (name, n) in enumerate(zip(names, dims)):
        if n == 1:
            continue
        moved = np.moveaxis(grid, axis + 1, -1)
        out[name] = GroupFamily(name, "tp", np.ascontiguousarray(moved.reshape(-1, n)))
    return out
