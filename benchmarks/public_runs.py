"""Shared helpers of the public-measurement validations (validate_h100.py, validate_zero3.py).

Reading a provenance-headed CSV, Megatron's vocabulary padding, predicting a row with the fit
check reported rather than fatal, and printing a plain or Markdown table.
"""

from __future__ import annotations

import csv
from pathlib import Path

import ddlsim
from ddlsim.errors import WorkTooLargeError

DATA = Path(__file__).with_name("data")
VOCAB_DIVISOR = 128   # Megatron/NeMo --make-vocab-size-divisible-by default


def read_csv(path: Path) -> list[dict]:
    """The rows of ``path``: ``#`` lines are its provenance header, the rest a CSV."""
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def header(path: Path) -> str:
    """The provenance header of ``path`` (its ``#`` lines, without the ``#``)."""
    return "\n".join(ln[1:].strip() for ln in path.read_text().splitlines()
                     if ln.startswith("#"))


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron's padded vocabulary: ``vocab`` rounded up to a multiple of 128·TP."""
    multiple = VOCAB_DIVISOR * tp
    return -(-vocab // multiple) * multiple


def predict(config: dict, engine: str) -> tuple[ddlsim.Result | None, str, str]:
    """``(result, refused, skipped)``: the prediction; for a plan ddlsim says does not fit,
    the prediction made with ``check_fit=False`` and the reason; for a run over the engine's
    work budget, no result and the reason."""
    try:
        try:
            return ddlsim.predict(config, engine), "", ""
        except ddlsim.PlanDoesNotFitError as exc:
            return ddlsim.predict(config, engine, check_fit=False), str(exc), ""
    except WorkTooLargeError as exc:
        return None, "", str(exc)


def print_table(head: list[str], lines: list[list[str]], markdown: bool) -> None:
    """Print ``lines`` under ``head``, aligned, or as a Markdown table."""
    if markdown:
        for cells in [head, ["---"] * len(head), *lines]:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(c[i]) for c in [head, *lines]) for i in range(len(head))]
    for cells in [head, *lines]:
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


def print_notes(out: list[dict], label) -> None:
    """One paragraph per row that was refused (does not fit) or not run (work budget)."""
    for o in out:
        if o["refused"] or o["skipped"]:
            print(f"\n{label(o)}: {o['refused'] or o['skipped']}")
