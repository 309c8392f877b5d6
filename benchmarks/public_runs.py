"""Shared helpers of the public-measurement validations (validate_h100.py, validate_bridge.py,
validate_zero3.py, validate_recompute.py).

Reading a provenance-headed CSV, Megatron's vocabulary padding, predicting a row with the fit
check reported rather than fatal, and printing a plain or Markdown table.
"""

from __future__ import annotations

import contextlib
import csv
import io
import sys
from pathlib import Path

import ddlsim
from ddlsim.errors import WorkTooLargeError
from ddlsim.limits import Limits
from ddlsim.textio import write_output

DATA = Path(__file__).with_name("data")
DOC = Path(__file__).parents[1] / "docs" / "validation.md"
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


def gpt_model_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one GPT iteration (no recomputation counted).

    Parameters
    ----------
    batch, seq : sequences per iteration (the global batch) and tokens per sequence.
    layers, hidden, vocab : the model's layers, width and vocabulary.

    Returns
    -------
    float
        FLOPs, ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``.

    References
    ----------
    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (arXiv:2205.05198), Appendix A.
    """
    return 72.0 * batch * seq * layers * hidden * hidden * (
        1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def predict(config: dict, engine: str, limits: Limits | None = None
            ) -> tuple[ddlsim.Result | None, str, str]:
    """``(result, refused, skipped)``: the prediction; for a plan ddlsim says does not fit,
    the prediction made with ``check_fit=False`` and the reason; for a run over the engine's
    work budget (``limits``, default ddlsim's), no result and the reason."""
    try:
        try:
            return ddlsim.predict(config, engine, limits=limits), "", ""
        except ddlsim.PlanDoesNotFitError as exc:
            return ddlsim.predict(config, engine, check_fit=False, limits=limits), str(exc), ""
    except WorkTooLargeError as exc:
        return None, "", str(exc)


def time_record(row: dict, config: dict, engine: str, limits: Limits | None,
                published: float) -> dict:
    """One row's record: ``row``, the prediction of ``config`` (:func:`predict`: ``result``,
    ``refused``, ``skipped``), the ``published`` iteration time and, when it ran,
    ``predicted`` and ``error`` (predicted / published − 1, positive: ddlsim too slow)."""
    r, refused, skipped = predict(config, engine, limits)
    rec = {"row": row, "result": r, "refused": refused, "skipped": skipped,
           "published": published}
    if r is not None:
        rec["predicted"] = r.iteration_time_s
        rec["error"] = r.iteration_time_s / published - 1
    return rec


def records(rows: list[dict], config, published_time, engine: str,
            limits: Limits | None = None) -> list[dict]:
    """One :func:`time_record` per row: ``config(row)`` predicted by ``engine`` against
    ``published_time(row)`` (seconds)."""
    return [time_record(row, config(row), engine, limits, published_time(row)) for row in rows]


def print_table(head: list[str], lines: list[list[str]], markdown: bool) -> None:
    """Print ``lines`` under ``head``, aligned, or as a Markdown table."""
    if markdown:
        for cells in [head, ["---"] * len(head), *lines]:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(c[i]) for c in [head, *lines]) for i in range(len(head))]
    for cells in [head, *lines]:
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


def print_notes(out: list[dict], label, markdown: bool = False) -> None:
    """One paragraph per row that was refused (does not fit) or not run (work budget); in
    Markdown, a list of their first sentences (the need against the capacity, or the budget)."""
    notes = [(label(o), o["refused"] or o["skipped"]) for o in out if o["refused"] or o["skipped"]]
    if markdown and notes:
        print()
    for name, why in notes:
        print(f"- {name}: {why.split('. ')[0]}." if markdown else f"\n{name}: {why}")


def add_arguments(ap) -> None:
    """The options both scripts take: engine, Markdown, and the DES work budget."""
    ap.add_argument("--engine", default="analytical", choices=["analytical", "des"])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--write-docs", action="store_true",
                    help="also replace this script's table in docs/validation.md (Markdown)")
    ap.add_argument("--des-rank-ops", type=float, default=None, metavar="N",
                    help="raise the DES work budget (ddlsim's Limits.des_rank_ops) to N; rows "
                         "over the budget are shown as not run")


def limits_of(args) -> Limits | None:
    """The work budget the options ask for (None: ddlsim's default)."""
    return None if args.des_rank_ops is None else Limits(des_rank_ops=int(args.des_rank_ops))


def markdown_of(show) -> str:
    """What ``show(markdown=True)`` prints, as a string."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        show(markdown=True)
    return buf.getvalue().strip("\n")


def write_docs(name: str, text: str) -> None:
    """Replace the block between ``<!-- name: begin -->`` and ``<!-- name: end -->`` in
    docs/validation.md with ``text``; exits naming the markers if the page lacks them."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    doc = DOC.read_text()
    if begin not in doc or end not in doc or doc.index(begin) > doc.index(end):
        sys.exit(f"{DOC}: no {begin} ... {end} block to replace; add the two markers where "
                 "the table belongs")
    new = doc[:doc.index(begin)] + f"{begin}\n\n{text}\n\n" + doc[doc.index(end):]
    write_output(DOC, new, force=True, what="docs page")


def error_stats(out: list[dict], label) -> str:
    """``mean |error| …, worst … (row), signed mean …`` over the rows that ran (the part of
    each script's summary line they share)."""
    ran = [o for o in out if o["result"] is not None]
    errors = [o["error"] for o in ran]
    worst = max(ran, key=lambda o: abs(o["error"]))
    return (f"mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, worst "
            f"{100 * abs(worst['error']):.1f}% ({label(worst)}), signed mean "
            f"{100 * sum(errors) / len(errors):+.1f}%")


def scaling_error(speedups: dict) -> float:
    """Mean of |predicted / published − 1| over the multi-GPU speed-ups predicted
    (``{key: (published, predicted or None)}``); NaN when none was."""
    sc = [(pub, pred) for pub, pred in speedups.values() if pred is not None]
    return sum(abs(pred / pub - 1) for pub, pred in sc) / len(sc) if sc else float("nan")


def result_cells(o: dict, digits: int = 3, missing: str = "not run (work limit)") -> list[str]:
    """A row's predicted time (marked when the plan does not fit) and its error cells, or
    ``missing`` and a dash for a row that did not run."""
    if o["result"] is None:
        return [missing, "-"]
    note = " (does not fit; check_fit=False)" if o["refused"] else ""
    return [f"{o['predicted']:.{digits}f}{note}", f"{100 * o['error']:+.1f}%"]


def rows_summary(out: list[dict], engine: str, label) -> str:
    """The summary line of a table of iteration times: :func:`error_stats`, the engine and how
    many rows ran."""
    ran = [o for o in out if o["result"] is not None]
    return (f"{error_stats(out, label)} ({engine} engine, {len(ran)} of {len(out)} rows; "
            "positive = ddlsim too slow)")


def run_script(name: str, doc: str, argv, evaluate, show, summary) -> int:
    """The command line both scripts share: evaluate every row with ``--engine``, print the
    table (``show(out, markdown)``) and ``summary(out, engine)``, and with ``--write-docs``
    put both between ``name``'s markers in docs/validation.md."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    out = evaluate(args.engine, limits=limits_of(args))
    show(out, args.markdown)
    print("\n" + summary(out, args.engine))
    if args.write_docs:
        write_docs(name, markdown_of(lambda markdown: show(out, markdown))
                   + "\n\n" + summary(out, args.engine))
    return 0
