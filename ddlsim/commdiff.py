"""``ddlsim comm --diff-mpip REPORT``: a real run's mpiP report against ``ddlsim comm``.

mpiP (LLNL/mpiP, doc/UserGuide.md, "mpiP Output") ends its report with the section
``@--- Callsite Message Sent statistics (all, sent bytes)``: one line per MPI call site and
rank, ``Name Site Rank Count Max Mean Min Sum``, where ``Count`` is the calls and ``Sum`` the
bytes sent over the run, plus an aggregate line per site with rank ``*``. It records sizes only
for calls that send, each with its own count argument (mpiP's ``make-wrappers.py``,
``messParamDict``): ``count`` of ``MPI_Allreduce``, ``MPI_Bcast`` (on every rank),
``MPI_Reduce``, ``MPI_Send``/``MPI_Isend``; ``sendcount`` of ``MPI_Allgather``,
``MPI_Alltoall`` (one peer's share), ``MPI_Gather``, ``MPI_Scatter``; ``recvcount`` of
``MPI_Ireduce_scatter_block``; and the non-blocking forms alike. Receives, barriers and
``MPI_Reduce_scatter_block`` have no size there. :func:`mpip_expected` turns a ``--per rank``
profile into those numbers; :func:`diff_mpip` compares them per (rank, call), summed over call
sites, with the run's iterations.
"""

from __future__ import annotations

import re

import numpy as np

from .commprofile import CommProfileError, _base

__all__ = ["read_mpip_sent", "mpip_expected", "diff_mpip", "DIFF_COLUMNS"]

_HEADER = re.compile(r"^@-+\s*Callsite Message Sent statistics", re.M)
DIFF_COLUMNS = ["rank", "call", "calls_ddlsim", "calls_mpip", "sent_bytes_ddlsim",
                "sent_bytes_mpip", "match"]
#: ddlsim op → mpiP's sent bytes, from a profile row's totals (send, recv, group size p)
_SENT = {
    "allreduce": lambda s, r, p: s, "reduce": lambda s, r, p: s, "send": lambda s, r, p: s,
    "allgather": lambda s, r, p: s, "gather": lambda s, r, p: s,
    "alltoall": lambda s, r, p: s / p, "alltoallv": lambda s, r, p: s,
    "bcast": lambda s, r, p: np.maximum(s, r), "scatter": lambda s, r, p: r,
    "reduce_scatter": lambda s, r, p: r,
}
#: blocking calls mpiP records no size for (their ``i`` forms it does)
_BLOCKING_UNSIZED = ("alltoallv", "reduce_scatter")


def _mpip_name(op: str) -> str:
    """MPI's function name as mpiP prints it (``iallreduce`` → ``Iallreduce``)."""
    name = op + ("_block" if op.endswith("reduce_scatter") else "")
    return name[0].upper() + name[1:]


def read_mpip_sent(text: str, source: str = "the mpiP report"):
    """Calls and bytes sent per (rank, call) from an mpiP report's "Callsite Message Sent
    statistics" section, summed over call sites (aggregate ``*`` lines skipped).

    Returns
    -------
    pandas.DataFrame
        Columns ``rank``, ``call`` (mpiP's name, e.g. ``Allreduce``), ``calls``, ``sent_bytes``.
    """
    import pandas as pd

    m = _HEADER.search(text)
    if m is None:
        raise CommProfileError(f"{source} has no '@--- Callsite Message Sent statistics' "
                               "section: run mpiP without -c or -d (they drop the per-rank "
                               "callsite sections)")
    rows = []
    for line in text[m.end():].splitlines()[1:]:
        if line.startswith("@---"):
            break
        parts = line.split()
        if len(parts) != 8 or parts[0] == "Name" or set(line.strip()) <= {"-"}:
            continue
        name, _site, rank, count, *_, total = parts
        if rank == "*":
            continue
        rows.append(_sent_row(line, name, rank, count, total, source))
    frame = pd.DataFrame(rows, columns=["rank", "call", "calls", "sent_bytes"]).astype(
        {"rank": np.int64, "call": object, "calls": np.int64, "sent_bytes": float})
    return frame.groupby(["rank", "call"], as_index=False)[["calls", "sent_bytes"]].sum()


#: Largest rank and call count read (10^7 ranks is the most devices a config may have;
#: 2^53 calls keeps every sum exact in float64 and int64).
_MAX_RANK, _MAX_CALLS = 10**7, 2**53


def _sent_row(line: str, name: str, rank: str, count: str, total: str,
              source: str) -> tuple[int, str, int, float]:
    """One line's (rank, call, calls, bytes sent), each checked: whole numbers in range, a
    finite byte sum >= 0."""
    def bad(why: str) -> CommProfileError:
        return CommProfileError(f"{source}: cannot read the line {line.strip()[:120]!r} of the "
                                f"message sent statistics (Name Site Rank Count Max Mean Min "
                                f"Sum): {why}")
    try:
        r, n, b = int(rank), int(count), float(total)
    except ValueError:
        raise bad("Rank and Count must be whole numbers and Sum a number") from None
    if not 0 <= r < _MAX_RANK:
        raise bad(f"Rank {rank} is not between 0 and {_MAX_RANK - 1:,}")
    if not 0 <= n <= _MAX_CALLS:
        raise bad(f"Count {count} is not between 0 and 2^53")
    if not (np.isfinite(b) and b >= 0):
        raise bad(f"Sum {total} is not a finite number >= 0")
    return r, name, n, b


def mpip_expected(profile):
    """What mpiP's message sent statistics should hold for one iteration of a ``--per rank``
    profile (:func:`ddlsim.commprofile.comm_profile`): per (rank, call), calls and bytes sent
    by mpiP's convention (module docstring)."""
    base = profile["op"].map(_base)
    sized = base.isin(list(_SENT)) & ~profile["op"].isin(_BLOCKING_UNSIZED)
    rows = profile[sized].copy()
    b = base[sized]
    rows["sent_bytes"] = [float(_SENT[k](s, r, p)) for k, s, r, p in zip(
        b, rows["send_bytes"], rows["recv_bytes"], rows["group_size"])]
    rows["call"] = rows["op"].map(_mpip_name)
    return rows.groupby(["rank", "call"], as_index=False)[["calls", "sent_bytes"]].sum()


def diff_mpip(profile, report, iterations: int = 1, rel: float = 0.01):
    """``ddlsim comm`` (× ``iterations``) against an mpiP report, per (rank, call).

    Parameters
    ----------
    profile : a ``--per rank`` profile of one iteration.
    report : :func:`read_mpip_sent` of the run.
    iterations : training iterations the profiled run made (warm-up included, unless mpiP
        was switched on with ``MPI_Pcontrol`` around the timed ones only).
    rel : relative tolerance on bytes (mpiP prints sums with 3 significant digits by default;
        calls must be equal).

    Returns
    -------
    pandas.DataFrame
        :data:`DIFF_COLUMNS`, one row per (rank, call) in either; ``match`` is False where
        calls differ or bytes differ by more than ``rel``.
    """
    if not (isinstance(iterations, int) and iterations >= 1):
        raise CommProfileError(f"--iterations must be a whole number >= 1, got {iterations!r}")
    sim = mpip_expected(profile)
    sim[["calls", "sent_bytes"]] = sim[["calls", "sent_bytes"]] * iterations
    both = sim.merge(report, on=["rank", "call"], how="outer", suffixes=("_ddlsim", "_mpip"))
    for col in ("calls_ddlsim", "calls_mpip", "sent_bytes_ddlsim", "sent_bytes_mpip"):
        both[col] = both[col].fillna(0)
    both["calls_ddlsim"] = both["calls_ddlsim"].astype(np.int64)
    both["calls_mpip"] = both["calls_mpip"].astype(np.int64)
    close = np.isclose(both["sent_bytes_ddlsim"], both["sent_bytes_mpip"], rtol=rel, atol=0)
    both["match"] = (both["calls_ddlsim"] == both["calls_mpip"]) & close
    return both.sort_values(["rank", "call"], kind="stable").reset_index(drop=True)[DIFF_COLUMNS]


def diff_report(profile, path, iterations: int, fmt: str) -> tuple[str, bool]:
    """The CLI's ``--diff-mpip PATH``: (the diff as ``fmt`` text, whether every row matches);
    a table ends with a one-line verdict."""
    from .report import dumps_json
    from .textio import read_text

    frame = diff_mpip(profile, read_mpip_sent(read_text(path, what="mpiP report"), str(path)),
                      iterations)
    ok = bool(frame["match"].all())
    for col in ("sent_bytes_ddlsim", "sent_bytes_mpip"):
        v = frame[col].to_numpy(dtype=float)
        if np.all(np.isfinite(v)) and np.all(v == np.round(v)) and np.all(np.abs(v) < 2**53):
            frame[col] = v.astype(np.int64)
    if fmt == "csv":
        return frame.to_csv(index=False, lineterminator="\n"), ok
    if fmt == "json":
        rows = [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
                for r in frame.to_dict(orient="records")]
        return dumps_json({"iterations": iterations, "match": ok, "rows": rows}), ok
    bad = int((~frame["match"]).sum())
    verdict = (f"all {len(frame)} (rank, call) rows match" if ok else
               f"{bad} of {len(frame)} (rank, call) rows differ (match = False)")
    return frame.to_string(index=False) + f"\n{verdict}\n", ok
