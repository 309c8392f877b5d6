"""Which flows a change of the flow set can affect: connected components of flows and links.

Max-min fair rates decompose over the connected components of the bipartite graph of flows
and the links they cross (no flow of one component shares a link with another), so when flows
start or end only the flows in the components of the links they touched need new rates. The
network narrows that further: it links flows only through the links that are saturated
(``through``), see :meth:`~.network.FlowNetwork._affected`. Small flow sets, and every scan
through saturated links, go breadth-first from the changed links (one vectorised pass per
hop, flows leave the scan once taken); large sets over all their links, where a long chain of
hops made that scan dominate whole runs (Megatron-LM 1T on 3,072 GPUs: 10,000 flows in
flight, 60 % of the time), and scans still growing after :data:`BFS_HOPS` hops, get one
:func:`scipy.sparse.csgraph.connected_components` pass. Both give the same set.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LinkedFlows", "BFS_BELOW", "BFS_HOPS"]

#: Below this many flows the breadth-first scan is cheaper than building the graph for
#: scipy. On 700 flow sets taken from the GPT-3 175B 1,024-GPU and Megatron-LM 1T 3,072-GPU
#: runs (loaded 2-core machine, scan with the hop limit below): under 1,000 flows 0.35 ms
#: against 6 ms; 1,000–2,000: 1.6 against 2.2 ms; 2,000–4,000: 7.0 against 4.8 ms; 8,000–
#: 16,000: 29 against 18 ms.
BFS_BELOW = 2000
#: The breadth-first scan gives up after this many hops and asks scipy (pipeline transfers
#: chain stage after stage through shared fabric links: on Megatron-LM 1T's sets of ~1,200
#: flows an unbounded scan took 3 ms a call, 30 % of the run).
BFS_HOPS = 4


class LinkedFlows:
    """Finds the flows linked to changed links; keeps its link-sized scratch arrays between
    calls (a network has tens of thousands of links, a change touches a few)."""

    def __init__(self, pad: int):
        self.pad = pad
        self._node = np.full(pad + 1, -1, dtype=np.int64)
        self._mark = np.zeros(pad + 1, dtype=bool)

    def __call__(self, edges: np.ndarray, seeds: list[np.ndarray],
                 through: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of the rows of ``edges`` connected, through shared links, to a seed.

        Parameters
        ----------
        edges : (F, W) int array
            Link ids each flow crosses, padded with ``pad`` (which links nothing).
        seeds : list of int arrays
            Links whose flows changed (any shape; ``pad`` entries are ignored).
        through : (pad + 1,) bool array, optional
            The links that link flows (default: every link). Every flow crossing a seed
            link is taken; from a taken flow the scan goes on only through its links in
            ``through``.

        Returns
        -------
        np.ndarray
            (F,) bool: flow f crosses a seed link, or a ``through`` link of the same
            component as some seed link, the components taken over the flows of ``edges``
            and their links.
        """
        if len(edges) < BFS_BELOW or through is not None:
            return self._grow(edges, seeds, through)
        return self._components(edges, seeds, through)

    def _grow(self, edges: np.ndarray, seeds: list[np.ndarray],
              through: np.ndarray | None = None) -> np.ndarray:
        """Breadth-first: mark the seed links, take the flows crossing a marked link, mark
        their links (those in ``through``), again; flows already taken leave the scan."""
        mark, pad = self._mark, self.pad
        found = np.zeros(len(edges), dtype=bool)
        touched = [np.ravel(s) for s in seeds]
        for rows in touched:
            mark[rows] = True
        mark[pad] = False
        rest, idx = edges, np.arange(len(edges))
        try:
            for _hop in range(BFS_HOPS):
                if not len(rest):
                    break
                hit = mark[rest].any(axis=1)
                if not hit.any():
                    break
                found[idx[hit]] = True
                links = rest[hit].ravel()
                if through is not None:
                    links = links[through[links]]
                links = links[~mark[links] & (links != pad)]
                if not len(links):  # no link newly marked: no other flow can be reached
                    break
                touched.append(links)
                mark[links] = True
                mark[pad] = False
                keep = ~hit
                rest, idx = rest[keep], idx[keep]
            else:  # still growing after BFS_HOPS hops: a long chain, hand it to scipy
                if len(rest) and mark[rest].any():
                    return self._components(edges, seeds, through)
        finally:
            for links in touched:
                mark[links] = False
        return found

    def _components(self, edges: np.ndarray, seeds: list[np.ndarray],
                    through: np.ndarray | None = None) -> np.ndarray:
        """One connected-components pass over the flow-link graph (scipy, compiled); with
        ``through``, the graph keeps only the links in it and the seed links."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import connected_components

        n_flows, pad, node_of = len(edges), self.pad, self._node
        if n_flows == 0:
            return np.zeros(0, dtype=bool)
        flat = edges.ravel()
        # every link is named by the position of (one of) its entries: no sort needed
        node_of[flat] = np.arange(n_flows, n_flows + len(flat))
        node_of[pad] = -1
        try:
            node = node_of[edges]
            seed = np.concatenate([np.ravel(s) for s in seeds]) if seeds else flat[:0]
            seed_nodes = node_of[seed]
        finally:
            node_of[flat] = -1
        real = node >= 0
        if through is not None:
            keep = through.copy()
            keep[seed] = True
            real &= keep[edges]
        n = n_flows + len(flat)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(real.sum(axis=1), out=indptr[1:n_flows + 1])
        indptr[n_flows + 1:] = indptr[n_flows]
        graph = csr_matrix((np.ones(int(indptr[n_flows])), node[real], indptr), shape=(n, n))
        count, label = connected_components(graph, directed=True, connection="weak")
        hit = np.zeros(count, dtype=bool)
        hit[label[seed_nodes[seed_nodes >= 0]]] = True
        return hit[label[:n_flows]]
