"""Fuzz ddlsim: ≥ 10,000 deterministic bad (and good) inputs, each judged ok, clean error,
traceback, timeout or memory.

    python benchmarks/fuzz.py --cases 10000 [--seed 0] [--jobs 2] [--timeout 60] [--rss-gb 1]
                              [--only cli,cli_opts,api,calibration,work] [--show 3]
    python benchmarks/fuzz.py --case K [--seed 0] [--keep DIR]   # replay one case, print it

Targets: ``cli`` (``ddlsim predict``/``topology show`` on generated files: mutated examples and
presets, YAML/JSON tricks, encodings, special paths), ``cli_opts`` (malformed options of every
command), ``api`` (``ddlsim.load_config``/``predict`` on mutated mappings) and ``calibration``
(the nccl-tests/OSU/CSV readers and ``calibrate fit``/``show`` on corrupted result files) and
``work`` (issue 31's first contact: ``sweep``/``search`` ranges and axes that are huge, long,
nested or of the wrong type, saved results and mpiP reports with impossible numbers,
``calibrate fit --max-segments``, options given twice, outputs naming an input).

Outcomes: ``ok`` (exit 0 / a return value), ``clean error`` (exit 2, a message whose line
starts ``error:`` — or click's usage error — and no traceback; in the API a
:class:`ddlsim.errors.DDLSimError`), ``bare message`` (refused, but with a message Python or a
library wrote rather than ddlsim: the CLI runs with ``DDLSIM_DEBUG=1`` so that the exception
itself is judged: a :class:`~ddlsim.errors.DDLSimError`, or an OS or decoding error the CLI
describes, is clean unless its text is one of Python's own (:data:`BARE`); a plain
``ValueError``/``OverflowError`` is bare), ``traceback`` (any other exception or exit status),
``timeout`` (past ``--timeout`` seconds of wall clock) and ``memory`` (``MemoryError`` under the
worker's address-space cap, ``--mem-gb``, or a peak resident set over ``--rss-gb``). Each case runs in a reused worker process that is
killed and replaced on a timeout. Case K is generated from ``random.Random("SEED:K")`` alone, so
``--case K`` replays it anywhere. The exit status is 1 if any case is not ok or a clean error.
See docs/robustness.md.

The cases come from ``fuzz_targets.py`` (with ``fuzz_docs.py``, the config mutations, and
``fuzz_work.py``, the work target); ``fuzz_run.py`` runs and judges one; this file holds the
workers, the report and the command line.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path

from fuzz_docs import REPO, _bases, _short
from fuzz_run import _from_exception, _materialize, run_case
from fuzz_targets import TARGETS, make_case
from fuzz_work import _saved_result

OUTCOMES = ("ok", "clean error", "bare message", "traceback", "timeout", "memory")
FAILURES = ("bare message", "traceback", "timeout", "memory")


# ================================================================================= workers
def _worker(conn, mem_bytes: int, seed: int, scratch: str, rss_bytes: int = 0) -> None:
    import resource
    import warnings

    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    os.environ["DDLSIM_DEBUG"] = "1"  # errors arrive whole, to be judged (_judged)
    warnings.simplefilter("ignore")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    _warm()
    conn.send("ready")
    while True:
        msg = conn.recv()
        case = make_case(seed, msg) if isinstance(msg, int) else msg
        try:
            res = run_case(case, scratch)
        except BaseException as exc:  # noqa: BLE001
            res = _from_exception(exc)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        if rss_bytes and peak > rss_bytes and res["outcome"] != "memory":
            res = {"outcome": "memory", "error": f"peak RSS {peak / 2**30:.2f} GiB",
                   "frame": res["outcome"], "last": "-", "tail": "", "seconds": res.get("seconds")}
        conn.send(res)
        if res["outcome"] == "memory":
            return  # a fresh process for the next case


def _warm() -> None:
    """Import what cases use, so that no case's deadline pays for it (done in the parent
    too: forked workers then start warm)."""
    import matplotlib
    matplotlib.use("Agg")
    import typer.testing  # noqa: F401
    import ddlsim.api  # noqa: F401
    import ddlsim.calibration.build  # noqa: F401
    import ddlsim.calibration.readers  # noqa: F401
    import ddlsim.cli  # noqa: F401
    import ddlsim.report  # noqa: F401
    import ddlsim.simulator.des  # noqa: F401
    import ddlsim.topologies.build  # noqa: F401
    _bases()
    _saved_result()


class Pool:
    """``jobs`` worker processes, each with an address-space cap; a case past ``timeout``
    seconds has its worker killed and replaced."""

    def __init__(self, jobs: int = 2, timeout: float = 60, mem_gb: float = 1.5, seed: int = 0,
                 rss_gb: float = 0.0):
        self.timeout, self.mem, self.seed = timeout, int(mem_gb * 2**30), seed
        self.rss = int(rss_gb * 2**30)
        self.ctx = mp.get_context("fork")
        # case directories live here, so that those of killed workers are removed too
        self.scratch = tempfile.mkdtemp(prefix="ddlsim-fuzz-")
        _warm()
        self.slots = [self._start() for _ in range(jobs)]

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, daemon=True,
                                args=(child, self.mem, self.seed, self.scratch, self.rss))
        proc.start()
        child.close()
        if not parent.poll(120) or parent.recv() != "ready":
            raise RuntimeError("a fuzz worker did not start")
        return {"proc": proc, "conn": parent, "task": None, "deadline": 0.0}

    def _restart(self, slot: dict) -> None:
        slot["proc"].kill()
        slot["proc"].join()
        slot["conn"].close()
        slot.update(self._start())

    def run(self, tasks):
        """Yield ``(task, result)`` for every task (a case number or a case dict)."""
        todo = list(tasks)[::-1]
        while todo or any(s["task"] is not None for s in self.slots):
            for s in self.slots:
                if s["task"] is None and todo:
                    s["task"] = todo.pop()
                    s["deadline"] = time.monotonic() + self.timeout
                    s["conn"].send(s["task"])
            busy = [s for s in self.slots if s["task"] is not None]
            left = max(0.0, min(s["deadline"] for s in busy) - time.monotonic())
            ready = wait([s["conn"] for s in busy], timeout=left)
            for s in busy:
                task = s["task"]
                if s["conn"] in ready:
                    try:
                        res = s["conn"].recv()
                    except (EOFError, OSError):
                        code = s["proc"].exitcode
                        res = {"outcome": "memory" if code is None or code < 0 else "traceback",
                               "error": f"worker died (exit {code})", "frame": "-",
                               "last": "-", "tail": ""}
                    if res["outcome"] == "memory" or "worker died" in res.get("error", ""):
                        self._restart(s)
                elif time.monotonic() >= s["deadline"]:
                    res = {"outcome": "timeout", "seconds": self.timeout}
                    self._restart(s)
                else:
                    continue
                s["task"] = None
                yield task, res

    def close(self) -> None:
        for s in self.slots:
            s["proc"].kill()
            s["proc"].join()
        shutil.rmtree(self.scratch, ignore_errors=True)


# ================================================================================== report
def describe(case: dict, limit: int = 400) -> str:
    """The case as a person reads it: target, command or call, and each file's content."""
    lines = [f"[{case['target']}] {case['desc']}"]
    if "argv" in case:
        lines.append("$ ddlsim " + " ".join(
            a[1:] if a.startswith("@") else (a if a and " " not in a else repr(a))
            for a in map(str, case["argv"])))
    if case.get("special"):
        lines.append(f"special path: {case['special']}")
    for name, content in case.get("files", {}).items():
        if isinstance(content, tuple):
            body = f"<{content[1][:limit]!r} then {content[2]!r} × {content[3]:,}>"
        elif isinstance(content, bytes):
            try:
                body = content.decode("utf-8")
            except UnicodeDecodeError:
                body = repr(content[:limit])
        else:
            body = content
        body = body if len(body) <= limit else body[:limit] + f"\n…({len(body):,} chars)"
        lines.append(f"--- {name}\n{body}")
    if "api" in case:
        lines.append(f"call: {case['api']['fn']}(*{_short(case['api']['args'], limit)}, "
                     f"**{_short(case['api']['kwargs'])})")
    return "\n".join(lines)


def _group(case: dict, res: dict) -> str:
    if res["outcome"] == "timeout":
        return f"timeout in {case['target']}: {case['kind']}"
    return f"{res.get('error')} @ {res.get('frame')}"


def report(results: list[tuple[dict, dict]], show: int, elapsed: float) -> int:
    counts: dict = defaultdict(Counter)
    groups: dict = defaultdict(list)
    for case, res in results:
        counts[case["target"]][res["outcome"]] += 1
        counts[case["target"]]["nonfinite"] += bool(res.get("nonfinite"))
        counts[case["target"]]["ms"] += round(1000 * res.get("seconds", 0.0))
        if res["outcome"] in FAILURES:
            groups[(res["outcome"], _group(case, res))].append((case, res))
    cols = OUTCOMES + (("skipped",) if any(c["skipped"] for c in counts.values()) else ())
    head = f"{'target':<12}" + "".join(f"{c:>13}" for c in cols) + f"{'total':>8}"
    print(head + "  mean ms  (ok with NaN/inf in output)\n" + "-" * len(head))
    total: Counter = Counter()
    for t in list(TARGETS) + ["total"]:
        row = total if t == "total" else counts.get(t)
        if row is None:
            continue
        if t != "total":
            total.update(row)
        n = sum(row[c] for c in cols)
        print(f"{t:<12}" + "".join(f"{row[c]:>13}" for c in cols) + f"{n:>8}"
              f"{row['ms'] / max(n, 1):>9.0f}  ({row['nonfinite']})")
    print(f"\n{sum(total[c] for c in cols)} cases in {elapsed:.1f} s")
    odd = [str(c["k"]) for c, r in results if r.get("nonfinite") and "k" in c]
    if odd:
        print(f"ok, but NaN/Infinity in the output: cases {', '.join(odd[:20])}")
    for (outcome, key), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        items.sort(key=lambda cr: len(describe(cr[0], 10**9)))
        nums = ", ".join(str(c["k"]) for c, _ in items[:12] if "k" in c)
        print(f"\n=== {outcome}: {key}  ({len(items)} cases: {nums}{' …' if len(items) > 12 else ''})")
        for case, res in items[:show]:
            print(f"--- case {case.get('k')}  ({res.get('seconds', 0):.2f} s)")
            print(describe(case))
            if res.get("tail"):
                print("  > " + res["tail"].replace("\n", "\n  > "))
    bad = sum(total[o] for o in FAILURES)
    return 1 if bad else 0


def _selected(seed: int, n: int, only: set[str] | None):
    k = 0
    while n:
        case = make_case(seed, k)
        if only is None or case["target"] in only:
            yield case
            n -= 1
        k += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--mem-gb", type=float, default=1.5, help="address-space cap per worker")
    ap.add_argument("--rss-gb", type=float, default=1.0,
                    help="a case whose worker's peak resident set passes this is 'memory'")
    ap.add_argument("--only", help=f"comma-separated targets: {', '.join(TARGETS)}")
    ap.add_argument("--show", type=int, default=3, help="examples printed per failure class")
    ap.add_argument("--case", type=int, help="replay case K: print its input and outcome")
    ap.add_argument("--keep", type=Path, help="with --case: also write its files into KEEP")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    if args.case is not None:
        return _replay(args)
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(TARGETS):
        ap.error(f"--only: unknown target(s) {sorted(only - set(TARGETS))}; allowed: {list(TARGETS)}")
    t0 = time.perf_counter()
    cases = {c["k"]: c for c in _selected(args.seed, args.cases, only)}
    pool = Pool(args.jobs, args.timeout, args.mem_gb, args.seed, args.rss_gb)
    results, step = [], max(1, args.cases // 20)
    try:
        for k, res in pool.run(sorted(cases)):
            results.append((cases[k], res))
            if len(results) % step == 0:
                print(f"  {len(results)}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    finally:
        pool.close()
    return report(results, args.show, time.perf_counter() - t0)


def _replay(args) -> int:
    case = make_case(args.seed, args.case)
    print(describe(case, 10**9 if args.keep else 4000))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        here = os.getcwd()
        os.chdir(args.keep)
        try:
            _materialize(case)
        finally:
            os.chdir(here)
        print(f"(files written to {args.keep})")
    pool = Pool(1, args.timeout, args.mem_gb, args.seed, args.rss_gb)
    try:
        (_, res), = pool.run([case])
    finally:
        pool.close()
    print(f"\noutcome: {res['outcome']} ({res.get('seconds', 0):.2f} s)")
    if res.get("tail"):
        print(res["tail"])
    return 1 if res["outcome"] in FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
