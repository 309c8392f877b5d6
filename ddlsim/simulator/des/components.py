"""Which flows a change of the flow set can affect: connected components of flows and links.

Max-min fair rates decompose over the connected components of the bipartite graph of flows
and the links they cross (no flow of one component shares a link with another), so when flows
start or end only the flows in the components of the links they touched need new rates.
The components are found in one pass with :func:`scipy.sparse.csgraph.connected_components`
(the engine's first version grew the set by repeated scans over all flows, one per hop of
the graph's diameter, which dominated runs with thousands of flows in flight).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LinkedFlows"]


class LinkedFlows:
    """Finds the flows linked to changed links; keeps its link-sized scratch arrays between
    calls (a network has tens of thousands of links, a change touches a few)."""

    def __init__(self, pad: int):
        self.pad = pad
        self._node = np.full(pad + 1, -1, dtype=np.int64)

    def __call__(self, edges: np.ndarray, seeds: list[np.ndarray]) -> np.ndarray:
        """Boolean mask of the rows of ``edges`` connected, through shared links, to a seed.

        Parameters
        ----------
        edges : (F, W) int array
            Link ids each flow crosses, padded with ``pad`` (which links nothing).
        seeds : list of int arrays
            Links whose flows changed (any shape; ``pad`` entries are ignored).

        Returns
        -------
        np.ndarray
            (F,) bool: flow f crosses a link of the same component as some seed link, the
            components taken over the flows of ``edges`` and their links.
        """
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import connected_components

        n_flows, pad, node_of = len(edges), self.pad, self._node
        if n_flows == 0:
            return np.zeros(0, dtype=bool)
        links = np.unique(edges)
        links = links[links != pad]
        node_of[links] = np.arange(n_flows, n_flows + len(links))
        try:
            node = node_of[edges]
            seed = np.concatenate([np.ravel(s) for s in seeds]) if seeds else links[:0]
            seed_nodes = node_of[seed]
        finally:
            node_of[links] = -1
        real = node >= 0
        n = n_flows + len(links)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(real.sum(axis=1), out=indptr[1:n_flows + 1])
        indptr[n_flows + 1:] = indptr[n_flows]
        graph = csr_matrix((np.ones(int(indptr[n_flows])), node[real], indptr), shape=(n, n))
        count, label = connected_components(graph, directed=True, connection="weak")
        hit = np.zeros(count, dtype=bool)
        hit[label[seed_nodes[seed_nodes >= 0]]] = True
        return hit[label[:n_flows]]
