"""The flow-level network: flows over routed links, max-min fair rates, completions in SimPy.

Flows live in a slot table (remaining bytes, rate, last update, projected finish, route as a
padded row of link ids). Rates change only when a flow starts or ends; then the flows of the
affected *domains* are brought up to date and their rates recomputed in one vectorised pass
(:func:`~.maxmin.max_min_rates`). A domain is a set of links that routes join (links never
crossed by a common route can be solved separately: max-min fairness decomposes over
connected components), so a tensor-parallel all-reduce inside one node never re-solves the
inter-node fabric. Inside a domain only the flows a change can reach through saturated links
are re-solved (:meth:`FlowNetwork._affected`, :mod:`.reach`). All submissions and completions at one
simulated instant are coalesced into a single recomputation; one SimPy timeout wakes the
network at the next completion.

A run whose links carry no other traffic may *reserve* them and skip the flow machinery
(see :mod:`.runs`); as soon as a flow is submitted over a reserved link, the run is
materialised into real flows with the bytes it has left, before rates are recomputed. The
reservation is per link, not per domain: flows that share no link with a run cannot change
its max-min rates, however their routes join its domain (a data-parallel ring's routes join
every node's NVLink and NIC domains into one, where a tensor-parallel collective and a
pipeline send still share no link).
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np
import simpy

from .flowtable import FlowTable, LinkLedger, link_counts, pad_to
from .components import LinkedFlows
from .maxmin import RateMemo
from .reach import affected, isolated
from .uniq import unique_inverse, unique_values

__all__ = ["FlowNetwork", "FlowOwner"]

#: A flow whose projected finish is within this relative distance of the wake-up time
#: finishes at the wake-up (symmetric flows finish together despite rounding).
_FINISH_TOL = 1e-12


class FlowOwner(Protocol):
    def flows_done(self, local: np.ndarray) -> None:
        """Flows ``local`` (row indices of the submission) have delivered all their bytes."""


class Reserver(Protocol):
    def materialise(self) -> None:
        """Give the reserved links back and continue as real flows from now on."""


class FlowNetwork:
    """Directed links with bandwidths; flows submitted by owners; rates max-min fair.

    Parameters
    ----------
    env : simpy.Environment
    bandwidth_Bps : (E,) array
        Bandwidth of every directed link (edge id = index), bytes/s.
    audit : bool
        After every recomputation, record the largest load/bandwidth ratio over all links
        (``max_load_ratio``); slower.
    shortcuts : bool
        Let runs on idle links reserve them instead of moving flows (exact; off only to
        check that it is).
    """

    def __init__(self, env: simpy.Environment, bandwidth_Bps: np.ndarray, audit: bool = False,
                 shortcuts: bool = True):
        self.env = env
        n_links = len(bandwidth_Bps)
        self.pad = n_links
        self.capacity_Bps = np.append(np.asarray(bandwidth_Bps, dtype=np.float64), np.inf)
        self.audit = audit
        self.shortcuts = shortcuts
        self.max_load_ratio = 0.0
        self._parent = np.arange(n_links + 1)
        self.root = self._parent.copy()
        #: per link, the id of the run that holds it (−1: none); runs by id, in the order
        #: they reserved (arrays, not a dict per link)
        self._holder = np.full(n_links + 1, -1, dtype=np.int64)
        self._runs: dict[int, Reserver] = {}
        #: per link, the flows submitted over it and not yet ended, plus 1 while a run holds
        #: it (a submission over a held link materialises the run first), so that the check
        #: of a run's links is one lookup (0: idle)
        self._taken = np.zeros(n_links + 1, dtype=np.int64)
        self._next_run = 0
        self._dirty = np.zeros(n_links + 1, dtype=bool)
        self._added: list[tuple[np.ndarray, np.ndarray]] = []  # (routes, slots) since the solve
        self._removed: list[np.ndarray] = []  # routes of flows ended since the last solve
        self._slots = FlowTable(width=1, pad=n_links)
        self._linked = LinkedFlows(n_links)
        self._lut = np.zeros(n_links + 1, dtype=np.int64)  # scratch, link id -> local index
        self._owners: dict[int, tuple[FlowOwner, int]] = {}
        self._next_owner = 0
        #: submissions not yet admitted: (edges, bytes, mult, owner id, domains, links, counts),
        #: the last two their routes' link_counts (taken at submission, booked at admission)
        self._pending: list[tuple] = []
        self._update_armed = False
        self._timers: list[float] = []
        self.links = LinkLedger(n_links)
        self._flow_counts: dict[int, tuple[object, float, int]] = {}
        self._rates = RateMemo(self.capacity_Bps)
        self.bytes_sent = self.bytes_delivered = 0.0
        self.flows_started = self.rate_updates = 0

    def close(self) -> None:
        """The run is over (no flow left): give back the flow table and the rate memo,
        which grew with the most flows ever in flight; the link ledger and the counters
        stay for the result."""
        self._slots = FlowTable(width=1, pad=self.pad)
        self._rates = RateMemo(self.capacity_Bps)

    # ------------------------------------------------------------------ domains
    def join(self, routes: list[np.ndarray]) -> None:
        """Declare that each route's links share a domain (a domain's root is its smallest
        link id; all routes are merged in one connected-components pass)."""
        chains = [r for r in routes if len(r) >= 2]
        if chains:
            self._merge(np.concatenate([r[:-1] for r in chains]),
                        np.concatenate([r[1:] for r in chains]))

    def join_rows(self, edges: np.ndarray) -> None:
        """:meth:`join` of routes given as padded link-id rows (k, w)."""
        linked = edges[:, 1:] != self.pad  # a route's links come first, the pad after
        self._merge(edges[:, :-1][linked], edges[:, 1:][linked])

    def _merge(self, first: np.ndarray, second: np.ndarray) -> None:
        """Merge the domains of links ``first[i]`` and ``second[i]``: connected components
        over the roots the pairs join (numbered compactly, so a merge costs what it joins,
        not the whole network), each component's new root its smallest."""
        root = self.root
        a, b = root[first], root[second]
        apart = a != b
        if not apart.any():
            return
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        roots, at = unique_inverse(np.concatenate([a[apart], b[apart]]), self._lut)
        half = len(at) // 2
        n = len(roots)
        graph = coo_matrix((np.ones(half, dtype=np.int8), (at[:half], at[half:])),
                           shape=(n, n))
        count, label = connected_components(graph, directed=False)
        low = np.full(count, self.pad + 1)
        np.minimum.at(low, label, roots)
        moved = np.arange(self.pad + 1)
        moved[roots] = low[label]
        self._parent[:] = moved[root]
        self._refresh_roots()

    def _refresh_roots(self) -> None:
        root = self._parent.copy()
        while not np.array_equal(nxt := root[root], root):
            root = nxt
        self._parent[:] = root
        self.root = root
        self._slots.relabel(root)
        dirty = np.zeros_like(self._dirty)
        dirty[root[self._dirty]] = True
        self._dirty = dirty
        self._pending = [(e, b, m, o, root[d], *rest) for e, b, m, o, d, *rest in self._pending]

    def idle(self, links: np.ndarray) -> bool:
        """No flow is active or pending on any of ``links`` and no run holds one."""
        return not np.count_nonzero(self._taken[links])  # ndarray.any: a Python-level wrapper

    def reserve(self, links: np.ndarray, run: Reserver) -> None:
        """``run`` holds the idle ``links`` (:meth:`idle`) until it releases them."""
        if len(links):
            self._holder[links] = rid = self._next_run
            self._taken[links] += 1  # idle: no flow; now held
            self._next_run += 1
            self._runs[rid] = run

    def release(self, links: np.ndarray) -> None:
        """Give back ``links`` (all of one run's, or none held any more)."""
        if len(links):
            rid = int(self._holder[links[0]])
            if rid >= 0:
                self._holder[links] = -1
                self._taken[links] -= 1  # held no more
                del self._runs[rid]

    def account(self, key: object, edges: np.ndarray, mult: np.ndarray, flow_bytes: float,
                links: np.ndarray, busy_s: float, new_flows: bool = True) -> None:
        """Book bytes and busy time of flows a reserving run moved without the flow table
        (``key`` names the row set, e.g. the template phase, so repeats are summed)."""
        self.links.carry_phase(key, edges, mult, flow_bytes)
        self.links.add_busy(links, busy_s)
        got = self._flow_counts.get(id(key))
        if got is None:  # flows per row set, summed once (the key is kept: its id stays its own)
            got = self._flow_counts[id(key)] = (key, float(mult.sum()), int(mult.sum()))
        moved = flow_bytes * got[1]
        self.bytes_sent += moved
        self.bytes_delivered += moved
        if new_flows:
            self.flows_started += got[2]

    # ------------------------------------------------------------------ submissions
    def submit(self, owner: FlowOwner, edges: np.ndarray, nbytes: np.ndarray,
               mult: np.ndarray, booked: bool = False) -> None:
        """Start flows now: ``edges`` (k, w) padded link ids, ``nbytes`` (k,) bytes per flow,
        ``mult`` (k,) identical flows per row. ``owner.flows_done`` is called as they end.
        The bytes are booked on their links now (every flow delivers all its bytes by the
        end of a run), unless the caller ``booked`` them (:meth:`LinkLedger.carry_phase`)."""
        if not booked:
            self.links.carry(edges, nbytes * mult)
        dom = self.root[edges[:, 0]]
        links, counts = link_counts(edges, self.pad + 1)
        if self._runs:  # runs holding these links go on as flows, in the order they reserved
            held = self._holder[links]
            for rid in unique_values(held[held >= 0]).tolist():
                run = self._runs.get(rid)   # (None: materialised meanwhile, by another's flows)
                if run is not None:
                    run.materialise()
        self._taken[links] += counts
        oid = self._next_owner
        self._next_owner += 1
        self._owners[oid] = (owner, len(edges))
        self._pending.append((edges, nbytes, mult, oid, dom, links, counts))
        self.bytes_sent += float(np.dot(nbytes, mult))
        self.flows_started += int(mult.sum())
        self._arm_update()

    def _arm_update(self) -> None:
        if not self._update_armed:
            self._update_armed = True
            ev = self.env.event()
            ev.callbacks.append(self._update)
            ev.succeed()

    def _update(self, _event: simpy.Event) -> None:
        env = self.env
        if env.peek() == env.now:  # more happens at this instant: recompute once, after it
            ev = env.event()
            ev.callbacks.append(self._update)
            ev.succeed()
            return
        self._update_armed = False
        if self._pending:
            self._admit()
        self._resolve()
        self._arm_timer()

    def _admit(self) -> None:
        pending, self._pending = self._pending, []
        width = max(p[0].shape[1] for p in pending)
        edges = np.concatenate([pad_to(p[0], width, self.pad) for p in pending])
        nbytes = np.concatenate([p[1] for p in pending])
        mult = np.concatenate([p[2] for p in pending])
        owner = np.concatenate([np.full(len(p[0]), p[3], dtype=np.int64) for p in pending])
        local = np.concatenate([np.arange(len(p[0]), dtype=np.int64) for p in pending])
        dom = np.concatenate([p[4] for p in pending])
        slots = self._slots.add(edges, nbytes, mult, owner, local, dom, self.env.now)
        self._dirty[dom] = True
        self._added.append((edges, slots))
        for p in pending:   # the counts taken at submission, in submission order
            self.links.start_counted(p[5], p[6], self.env.now)

    # ------------------------------------------------------------------ rates
    def _resolve(self) -> None:
        s = self._slots
        now = self.env.now
        added, removed = self._added, self._removed
        self._added, self._removed = [], []
        if self._isolated(added, removed):
            sel = np.concatenate([slots for _, slots in added]) if added else np.empty(0, np.int64)
            rate = None
        else:
            sel, rate = self._affected(s.select(self._dirty),
                                       [edges for edges, _ in added] + removed)
        self._dirty[:] = False
        if len(sel) == 0:
            return
        self.rate_updates += 1
        self._advance(sel, now)
        if rate is None:
            rate = self._rates(s.edges[sel], s.mult[sel])
        s.rate[sel] = rate
        with np.errstate(divide="ignore", invalid="ignore"):
            s.t_done[sel] = now + np.where(np.isinf(rate), 0.0, s.rem[sel] / rate)
        if self.audit:
            self._audit()

    def _affected(self, pool: np.ndarray, seeds: list[np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The flows of ``pool`` (slots) whose rates the change can move, and their new
        rates (:func:`.reach.affected`)."""
        return affected(self._slots, pool, seeds, self.capacity_Bps, self.pad,
                        self.links.users, self._linked, self._rates, self._lut)

    def _isolated(self, added: list, removed: list[np.ndarray]) -> bool:
        """Only the new flows need rates (:func:`.reach.isolated`)."""
        return isolated(self.links.users, self.pad, added, removed)

    def _advance(self, idx: np.ndarray, now: float) -> None:
        """Move flows ``idx`` forward to ``now`` at their current rates."""
        s = self._slots
        dt = now - s.t_last[idx]
        rem = s.rem[idx]
        with np.errstate(invalid="ignore"):
            moved = np.where(dt > 0, np.minimum(s.rate[idx] * dt, rem), 0.0)
        s.rem[idx] = rem - moved
        s.t_last[idx] = now
        self.bytes_delivered += float(np.dot(moved, s.mult[idx]))

    def _audit(self) -> None:
        s = self._slots
        live = s.live()
        load = np.bincount(s.edges[live].ravel(),
                           weights=np.repeat(s.rate[live] * s.mult[live], s.edges.shape[1]),
                           minlength=self.pad + 1)[:-1]
        if len(load):
            self.note_load_ratio(float((load / self.capacity_Bps[:-1]).max()))

    def note_load_ratio(self, ratio: float) -> None:
        self.max_load_ratio = max(self.max_load_ratio, ratio)

    # ------------------------------------------------------------------ completions
    def _arm_timer(self) -> None:
        t_next = self._slots.next_finish()
        if t_next == np.inf or (self._timers and self._timers[0] <= t_next):
            return
        heapq.heappush(self._timers, t_next)
        self.env.timeout(max(t_next - self.env.now, 0.0)).callbacks.append(self._on_timer)

    def _on_timer(self, _event: simpy.Event) -> None:
        heapq.heappop(self._timers)
        now = self.env.now
        done = self._slots.finished_by(now * (1.0 + _FINISH_TOL))
        if len(done):
            self._finish(done, now)
            self._arm_update()
        self._arm_timer()

    def _finish(self, done: np.ndarray, now: float) -> None:
        s = self._slots
        self._advance(done, now)
        self._dirty[s.dom[done]] = True
        edges = s.edges[done]
        self._removed.append(edges)
        owners, local = s.owner[done], s.local[done]
        links, counts = self.links.finish(edges, now)
        self._taken[links] -= counts
        s.remove(done)
        order = np.lexsort((local, owners))
        owners, local = owners[order], local[order]
        cuts = [0, *(np.flatnonzero(np.diff(owners)) + 1).tolist(), len(owners)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            oid = int(owners[a])
            owner, left = self._owners[oid]
            left -= b - a
            if left:
                self._owners[oid] = (owner, left)
            else:
                del self._owners[oid]
            owner.flows_done(local[a:b])

