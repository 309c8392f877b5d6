"""Storage of the flow network: the table of active flows and the per-link ledger."""

from __future__ import annotations

import numpy as np

from .uniq import unique_counts, unique_values

__all__ = ["FlowTable", "LinkLedger", "link_counts", "pad_to"]


class FlowTable:
    """Structure-of-arrays flow table with a free list (slot order is deterministic)."""

    def __init__(self, width: int, pad: int, capacity: int = 256):
        self.pad = pad
        self.n = 0  # high-water mark
        self.free: list[int] = []
        self._alloc(capacity, width)

    def _alloc(self, capacity: int, width: int) -> None:
        old = getattr(self, "rem", None)
        fields = {"rem": np.float64, "rate": np.float64, "t_last": np.float64,
                  "t_done": np.float64, "mult": np.float64, "bytes0": np.float64,
                  "owner": np.int64, "local": np.int64, "dom": np.int64}
        for name, dtype in fields.items():
            arr = np.zeros(capacity, dtype=dtype)
            if old is not None:
                arr[:self.n] = getattr(self, name)[:self.n]
            setattr(self, name, arr)
        alive = np.zeros(capacity, dtype=bool)
        edges = np.full((capacity, width), self.pad, dtype=np.int64)
        if old is not None:
            alive[:self.n] = self.alive[:self.n]
            w = self.edges.shape[1]
            edges[:self.n, :w] = self.edges[:self.n]
        self.alive, self.edges = alive, edges
        self.t_done[self.n:] = np.inf

    def add(self, edges, nbytes, mult, owner, local, dom, now) -> np.ndarray:
        k = len(edges)
        width = max(edges.shape[1], self.edges.shape[1])
        reuse = min(k, len(self.free))
        slots = np.empty(k, dtype=np.int64)
        if reuse:
            slots[:reuse] = self.free[len(self.free) - reuse:][::-1]
            del self.free[len(self.free) - reuse:]
        fresh = k - reuse
        if self.n + fresh > len(self.rem) or width > self.edges.shape[1]:
            self._alloc(max(2 * len(self.rem), self.n + fresh), width)
        slots[reuse:] = np.arange(self.n, self.n + fresh)
        self.n += fresh
        self.edges[slots] = self.pad
        self.edges[slots, :edges.shape[1]] = edges
        self.rem[slots] = nbytes
        self.bytes0[slots] = nbytes
        self.rate[slots] = 0.0
        self.t_last[slots] = now
        self.t_done[slots] = np.inf
        self.mult[slots] = mult
        self.owner[slots] = owner
        self.local[slots] = local
        self.dom[slots] = dom
        self.alive[slots] = True
        return slots

    def remove(self, slots: np.ndarray) -> None:
        self.alive[slots] = False
        self.t_done[slots] = np.inf
        self.free.extend(slots[::-1].tolist())

    def live(self) -> np.ndarray:
        return np.flatnonzero(self.alive[:self.n])

    def select(self, dirty: np.ndarray) -> np.ndarray:
        n = self.n
        return np.flatnonzero(self.alive[:n] & dirty[self.dom[:n]])

    def relabel(self, root: np.ndarray) -> None:
        n = self.n
        self.dom[:n] = root[self.dom[:n]]

    def next_finish(self) -> float:
        return float(self.t_done[:self.n].min()) if self.n else np.inf

    def finished_by(self, t: float) -> np.ndarray:
        return np.flatnonzero(self.t_done[:self.n] <= t)


class LinkLedger:
    """Per-link bytes carried and busy time (time with at least one flow on the link).

    Bytes are booked lazily: rows of links with their bytes are kept by width (and repeated
    phases of one template summed per phase) and folded into per-link totals in bulk.
    Busy time that runs on idle links add to a whole set of links at once
    (:meth:`add_busy`) is kept as one number per set while every link of the set has the
    same busy time and nothing else has touched them: adding to that number is the same
    floating-point operation as adding to each link, so the totals are the same bit for bit.
    """

    def __init__(self, n_links: int):
        self._busy = np.zeros(n_links + 1)
        self._bound = np.full(n_links + 1, -1, dtype=np.int64)  # link → its set's id, or −1
        self._sets: dict[int, list] = {}   # id(links) → [links, set id]
        self._set_ids: dict[bytes, int] = {}  # a set's links (bytes) → its id
        self._set_busy: list[float] = []   # per set id: the busy time of each of its links
        self._set_links: list[np.ndarray | None] = []  # per set id: its links while bound
        self.users = np.zeros(n_links + 1, dtype=np.int64)
        self.since = np.zeros(n_links + 1)
        self._carried: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._phases: dict[int, list] = {}
        self._bytes = np.zeros(n_links + 1)
        self._pending_rows = 0

    def start(self, edges: np.ndarray, now: float) -> None:
        """Flows ``edges`` started."""
        self.start_counted(*link_counts(edges, len(self.users)), now)

    def start_counted(self, links: np.ndarray, counts: np.ndarray, now: float) -> None:
        """Flows over ``links`` started, ``counts[i]`` of them over ``links[i]`` (their routes'
        :func:`link_counts`, where the caller has them already)."""
        self.since[links[self.users[links] == 0]] = now
        self.users[links] += counts

    def finish(self, edges: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Flows ``edges`` ended (their bytes were booked when they started); returns
        :func:`link_counts` of ``edges``."""
        links, counts = link_counts(edges, len(self.users))
        self.users[links] -= counts
        idle = links[self.users[links] == 0]
        self._unbind(idle)
        self._busy[idle] += now - self.since[idle]
        return links, counts

    @property
    def busy_s(self) -> np.ndarray:
        """Seconds each link carried at least one flow (the pad last)."""
        self._unbind(None)
        return self._busy

    def add_busy(self, links: np.ndarray, seconds: float) -> None:
        """Links ``links`` (an array kept unchanged, distinct ids) were busy ``seconds`` more."""
        got = self._sets.get(id(links))
        if got is None:
            got = self._sets[id(links)] = [links, self._set_ids.setdefault(
                links.tobytes(), len(self._set_ids))]
            self._set_busy.append(0.0)
            self._set_links.append(None)
        sid = got[1]
        if self._set_links[sid] is not None:
            self._set_busy[sid] += seconds
            return
        self._unbind(links)
        busy = self._busy
        busy[links] += seconds
        if len(links) and (busy[links] == busy[links[0]]).all():
            self._set_busy[sid] = float(busy[links[0]])
            self._set_links[sid] = links
            self._bound[links] = sid

    def _unbind(self, links: np.ndarray | None) -> None:
        """Write the busy time of the sets bound on ``links`` (None: every set) to their
        links, and unbind them."""
        if not self._set_ids:
            return
        bound = self._bound if links is None else self._bound[links]
        for sid in unique_values(bound[bound >= 0]).tolist():
            own = self._set_links[sid]
            self._busy[own] = self._set_busy[sid]
            self._bound[own] = -1
            self._set_links[sid] = None

    def carry(self, edges: np.ndarray, nbytes: np.ndarray) -> None:
        """Bytes ``nbytes[i]`` moved over the links of row ``edges[i]``."""
        self._carried.setdefault(edges.shape[1], []).append((edges, nbytes))
        self._pending_rows += len(edges)
        if self._pending_rows > 1 << 18:
            self._flush()

    def carry_phase(self, key: object, edges: np.ndarray, weights: np.ndarray,
                    scale: float) -> None:
        """Like :meth:`carry` with bytes ``weights × scale`` for a fixed set of rows booked
        again and again (``key`` names it; its ``weights`` are the same every time): the
        scales are summed and the rows folded in once."""
        got = self._phases.get(id(key))
        if got is None:
            self._phases[id(key)] = [key, edges, np.asarray(weights, dtype=np.float64), scale]
        else:
            got[3] += scale

    def _flush(self) -> None:
        for width, parts in self._carried.items():
            edges = np.concatenate([e for e, _ in parts])
            weights = np.concatenate([w for _, w in parts])
            self._bytes += np.bincount(edges.ravel(), weights=np.repeat(weights, width),
                                       minlength=len(self._bytes))
        self._carried = {}
        self._pending_rows = 0

    def bytes(self) -> np.ndarray:
        """Bytes each link carried (pad excluded)."""
        for _key, edges, weights, scale in self._phases.values():
            self.carry(edges, weights * scale)
        self._phases = {}
        self._flush()
        return self._bytes[:-1].copy()


def link_counts(edges: np.ndarray, n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct link ids in ``edges`` (ascending) and how often each occurs: a bincount
    when the ids are dense enough, a sort otherwise (an all-to-all lists each link hundreds
    of times; one link per id replaces ``np.add.at`` over every entry)."""
    flat = edges.ravel()
    if flat.size * 8 >= n_links:
        counts = np.bincount(flat, minlength=n_links)
        links = np.flatnonzero(counts)
        return links, counts[links]
    return unique_counts(flat)


def pad_to(edges: np.ndarray, width: int, pad: int) -> np.ndarray:
    """``edges`` (k, w ≤ width) widened to ``width`` columns with ``pad``."""
    if edges.shape[1] == width:
        return edges
    out = np.full((edges.shape[0], width), pad, dtype=edges.dtype)
    out[:, :edges.shape[1]] = edges
    return out
