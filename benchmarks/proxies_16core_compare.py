"""The seed's proxies measured on another machine's idle cores (issue #30), read back: the rows
``benchmarks/device/proxies_16core.sh`` left, each predicted again by this ddlsim with both
engines on the host they ran on (``proxies_check.py --host``: one device per usable core,
the link and collectives from the calibration taken right before that rank count's runs),
then ``proxies_check.py``'s report and the issue's summary line.

    python benchmarks/proxies_16core_compare.py DIR/proxies16.tar.gz
    python benchmarks/proxies_16core_compare.py DIR       # the archive unpacked (or its
                                                          # proxies16/ folder)

Prints the machine it ran on (``machine.txt``), one line per row (``proxies_check._row_line``),
a Markdown table of the rows for docs/validation.md, every proxy config's answer and the
summary (``proxies_check.report``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tarfile
import tempfile
from pathlib import Path

from proxies_check import _row_line, host_cores, report, repredict

__all__ = ["runs", "table", "main"]


def runs(folder: Path) -> list[Path]:
    """The step folders under ``folder`` that hold a ``rows.json`` (each also holds the
    profiles its rows were predicted with), in name order; none is an error naming the
    folder."""
    found = sorted(p.parent for p in folder.rglob("rows.json"))
    if not found:
        raise FileNotFoundError(f"{folder}: no rows.json under it; give the folder "
                                "proxies_16core.sh packed (or its proxies16.tar.gz)")
    return found


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows: proxy, ranks, the median and each launch (ms), the
    other runnable tasks before and after, and each engine's prediction and error."""
    lines = ["| proxy | ranks | measured (launches) | other tasks | analytical | DES |",
             "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["ranks"], r["proxy"])):
        launches = ", ".join(f"{t * 1e3:.2f}" for t in r["runs_s"])
        others = " → ".join(f"{x:.1f}" for x in r.get("background", []))
        engines = [f"{r[f'predicted_{e}_s'] * 1e3:.2f} ms, {100 * r[f'error_{e}']:+.1f} %"
                   for e in ("analytical", "des")]
        lines.append(f"| {r['proxy']} | {r['ranks']} | {r['measured_s'] * 1e3:.2f} ms "
                     f"({launches}) | {others} | {engines[0]} | {engines[1]} |")
    return "\n".join(lines)


def _unpacked(path: Path, tmp: str) -> Path:
    """The folder to read: ``path`` itself, or a ``.tar.gz`` unpacked into ``tmp``."""
    if path.is_dir():
        return path
    if path.is_file() and path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        return Path(tmp)
    raise FileNotFoundError(f"{path}: neither a folder nor a .tar.gz archive")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path,
                    help="proxies16.tar.gz, or the folder it was unpacked into")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = _unpacked(args.results, tmp)
        for machine in sorted(folder.rglob("machine.txt")):
            print(machine.read_text().rstrip())
        rows = []
        for run in runs(folder):
            rows += repredict(json.loads((run / "rows.json").read_text()), run)
    cores = host_cores(rows)
    print(f"\n{len(rows)} rows on host-{cores}core" if cores else f"\n{len(rows)} rows")
    for row in rows:
        print(_row_line(row))
    sleeps = [r["sleep_100us_us"] for r in rows]
    if sleeps:
        print(f"a niced 100 us sleep took {min(sleeps):.0f}-{max(sleeps):.0f} us "
              f"(median {statistics.median(sleeps):.0f}) beside the rows")
    print("\n" + table(rows) + "\n")
    report(rows)


if __name__ == "__main__":
    main()
