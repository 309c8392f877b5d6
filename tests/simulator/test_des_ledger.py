"""The flow network's per-link counting: ``link_counts`` and ``unique_inverse`` against
``np.unique`` on both of their paths (bincount for dense ids, sort for sparse ones), and the
link ledger's users and busy time against a per-entry reference (``np.add.at`` over every
route entry, as it was counted before the counting went per link)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.simulator.des.flowtable import LinkLedger, link_counts


@pytest.mark.parametrize("n_links", [12, 100_000])   # dense: bincount; sparse: sort
def test_link_counts_is_unique_with_counts(n_links):
    rng = np.random.default_rng(7)
    edges = rng.integers(0, 12, size=(40, 3)) * (n_links // 12)
    links, counts = link_counts(edges, n_links)
    want_links, want_counts = np.unique(edges, return_counts=True)
    assert links.tolist() == want_links.tolist()
    assert counts.tolist() == want_counts.tolist()


def _reference(batches, n_links):
    """Users and busy seconds by per-entry updates."""
    users = np.zeros(n_links + 1, np.int64)
    since, busy = np.zeros(n_links + 1), np.zeros(n_links + 1)
    for kind, edges, now in batches:
        flat = edges.ravel()
        if kind == "start":
            since[flat[users[flat] == 0]] = now
            np.add.at(users, flat, 1)
        else:
            np.subtract.at(users, flat, 1)
            idle = flat[users[flat] == 0]
            busy[idle] = busy[idle] + (now - since[idle])
    return users, busy


def test_ledger_matches_per_entry_counting():
    rng = np.random.default_rng(3)
    n_links = 30
    ledger = LinkLedger(n_links)
    live, batches, now = [], [], 0.0
    for _ in range(200):
        now += float(rng.random())
        if live and rng.random() < 0.45:
            edges = live.pop(int(rng.integers(len(live))))
            batches.append(("finish", edges, now))
            ledger.finish(edges, now)
        else:
            edges = rng.integers(0, n_links + 1, size=(int(rng.integers(1, 20)), 4))
            live.append(edges)
            batches.append(("start", edges, now))
            ledger.start(edges, now)
    users, busy = _reference(batches, n_links)
    assert ledger.users.tolist() == users.tolist()
    assert ledger.busy_s.tolist() == busy.tolist()   # bit for bit
    assert busy[:-1].any()


def test_unique_inverse_by_counting_is_numpys():
    from ddlsim.simulator.des.uniq import unique_inverse
    a = np.random.default_rng(5).integers(0, 50, size=400)
    lut = np.zeros(64, dtype=np.int64)
    values, inverse = unique_inverse(a, lut)
    want_values, want_inverse = np.unique(a, return_inverse=True)
    assert values.tolist() == want_values.tolist()
    assert inverse.tolist() == want_inverse.tolist()


def test_busy_time_of_link_sets_is_added_link_by_link():
    """Busy time added to whole link sets (runs on idle links), interleaved with flows
    starting and ending on some of the same links, equals adding it to each link in turn,
    bit for bit: a set's common busy time is kept as one number only while that is exact."""
    rng = np.random.default_rng(11)
    n_links = 24
    ledger = LinkLedger(n_links)
    want = np.zeros(n_links + 1)
    users = np.zeros(n_links + 1, np.int64)
    since = np.zeros(n_links + 1)
    sets = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 24)]
    sets.append(sets[1].copy())  # the same links in another array: one set
    sets.append(np.arange(4, 12))  # overlapping two others: rarely used
    live, now = [], 0.0
    for _ in range(400):
        now += float(rng.random())
        roll = rng.random()
        if roll < 0.5:
            links = sets[int(rng.integers(len(sets) - (rng.random() > 0.05)))]
            dt = float(rng.random()) / 3.0
            ledger.add_busy(links, dt)
            want[links] += dt
        elif live and roll < 0.75:
            edges = live.pop(int(rng.integers(len(live))))
            ledger.finish(edges, now)
            np.subtract.at(users, edges.ravel(), 1)
            idle = np.unique(edges.ravel()[users[edges.ravel()] == 0])
            want[idle] += now - since[idle]
        else:
            edges = (rng.integers(12, n_links + 1, size=(int(rng.integers(1, 4)), 3))
                     if rng.random() < 0.3 else sets[int(rng.integers(len(sets) - 1))][None, :])
            live.append(edges)
            ledger.start(edges, now)
            flat = edges.ravel()
            since[flat[users[flat] == 0]] = now
            np.add.at(users, flat, 1)
    assert ledger.busy_s.tolist() == want.tolist()


@pytest.mark.parametrize("high", [[3, 5, 2, 8], [131_072, 131_072, 8], [2**40, 2**30]])
def test_unique_rows_is_numpys(high):
    """Packed rows (and numpy's own sort where a packed row would not fit in 62 bits)."""
    from ddlsim.simulator.des.uniq import unique_rows
    rng = np.random.default_rng(len(high))
    keys = np.stack([rng.integers(0, h, size=3000) for h in high], axis=1)
    keys = np.concatenate([keys, keys[::7]])  # repeated rows
    rows, counts = unique_rows(keys)
    want_rows, want_counts = np.unique(keys, axis=0, return_counts=True)
    assert rows.tolist() == want_rows.tolist()
    assert counts.tolist() == want_counts.tolist()
