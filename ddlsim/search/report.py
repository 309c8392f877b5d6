"""What ``ddlsim search`` shows: the ranked table, the Pareto front, the summary, the plot."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..formatting import format_bytes, format_percent, format_time

__all__ = ["ranked_table", "pareto_table", "summary_text", "grouped_reasons", "draw_search",
           "plan_label", "legend", "hidden_parts", "plan_text_frame"]

#: How a short plan label writes ``train.recompute``.
RECOMPUTE_SHORT = {"none": "none", "selective": "sel", "full": "full"}


def plan_label(row: dict, extra: Sequence[str] = (), short: bool = True,
               hide: frozenset[str] = frozenset({"schedule"})) -> str:
    """``'TP8 PP16×2 DP8 b1 Z1 SP sel'`` (``short``, explained by :func:`legend`) or
    ``'TP8 PP16×2 DP8 mbs1 ZeRO1 SP selective'``: one plan in a few characters, without the
    parts in ``hide`` (:func:`hidden_parts`)."""
    v = row["parallel.virtual_pipeline_model_parallel_size"]
    mbs, zero = ("b", "Z") if short else ("mbs", "ZeRO")
    rec = row["train.recompute"]
    parts = [] if "tp" in hide else [f"TP{row['parallel.tensor_model_parallel_size']}"]
    if "pp" not in hide:
        parts.append(f"PP{row['parallel.pipeline_model_parallel_size']}"
                     f"{f'×{v}' if v and v > 1 else ''}")
    parts += [f"DP{row['parallel.data_parallel_size']}", f"{mbs}{row['train.micro_batch_size']}"]
    if "zero" not in hide:
        parts.append(f"{zero}{row['parallel.zero_stage']}")
    if "sp" not in hide and row["parallel.sequence_parallel"]:
        parts.append("SP")
    if "recompute" not in hide:
        parts.append(RECOMPUTE_SHORT.get(rec, rec) if short else rec)
    if "schedule" not in hide and not (v and v > 1):   # PP×v already says interleaved
        parts.append(row["parallel.schedule"])
    return " ".join([*parts, *(_extra_part(p, row[p], short) for p in extra)])


#: Context axes a short label writes as a parallel size (``CP8``), as ``TP``/``PP``/``DP``
#: are written; :func:`legend` names them.
EXTRA_SIZES = {"parallel.context_parallel_size": ("CP", "context-parallel size"),
               "parallel.expert_model_parallel_size": ("EP", "expert-parallel size"),
               "parallel.expert_tensor_parallel_size": ("ETP", "expert tensor-parallel size")}


def _extra_part(path: str, value: Any, short: bool) -> str:
    """A context axis's value in a plan label: a parallel size of :data:`EXTRA_SIZES` as
    ``CP8`` and a software stack by its name alone (``short``), else ``key=value``."""
    if short and path in EXTRA_SIZES:
        return f"{EXTRA_SIZES[path][0]}{value}"
    if short and path == "system.software" and isinstance(value, str):
        return value
    return f"{path.rpartition('.')[2]}={value}"


def hidden_parts(frame) -> frozenset[str]:
    """The parts of :func:`plan_label` a frame's labels leave out: none for the decoder
    families (``frame.attrs["plan_fields"]`` unset: their plan is the whole ``parallel``
    section); for another family, sequence parallelism and recomputation where it does not
    read them, and TP, PP and ZeRO where every plan has 1, 1 and 0 (its rules refuse more,
    or the grid does not vary them). The schedule is shown only where the plans without
    interleaving differ in it (an axis ``parallel.schedule: [1f1b, gpipe]``)."""
    if not len(frame):
        return frozenset({"schedule"})
    plain = frame["parallel.virtual_pipeline_model_parallel_size"].fillna(1) <= 1
    schedules = frame.loc[plain.to_numpy(), "parallel.schedule"].nunique()
    hide = set() if schedules > 1 else {"schedule"}
    fields = frame.attrs.get("plan_fields")
    if fields is None:
        return frozenset(hide)
    hide |= {name for name, path in (("sp", "parallel.sequence_parallel"),
                                    ("recompute", "train.recompute")) if path not in fields}
    for name, path, default in (("tp", "parallel.tensor_model_parallel_size", 1),
                                ("pp", "parallel.pipeline_model_parallel_size", 1),
                                ("zero", "parallel.zero_stage", 0)):
        if (frame[path] == default).all():
            hide.add(name)
    return frozenset(hide)


def legend(frame, exact: bool, front: bool) -> str:
    """Every abbreviation of the search tables, in words (those its labels show)."""
    hide = hidden_parts(frame)
    sizes = "/".join(n for n, k in (("TP", "tp"), ("PP", "pp"), ("DP", "")) if k not in hide)
    words = ", ".join(w for w, k in (("tensor-", "tp"), ("pipeline-", "pp"), ("data-", ""))
                      if k not in hide)
    no_virtual = (not len(frame) or "pp" in hide
                  or frame["parallel.virtual_pipeline_model_parallel_size"].fillna(1).max() <= 1)
    parts = [f"{sizes} {words}parallel size"
             + ("" if no_virtual else "; PP8×6 8 stages of 6 virtual stages each "
                "(interleaved schedule)") + "; b micro-batch size"
             + ("" if "zero" in hide else "; Z ZeRO stage")
             + ("" if "sp" in hide or not frame["parallel.sequence_parallel"].any()
                else "; SP sequence parallelism")
             + ("" if "recompute" in hide else "; none/sel/full recomputation")
             + ("" if "schedule" in hide else "; 1f1b/gpipe the schedule of a plan without "
                "virtual stages")]
    extra = _context_columns(frame)
    parts += [f"{short} {words}" for path, (short, words) in EXTRA_SIZES.items()
              if path in extra]
    if "system.software" in extra:
        parts.append("the software stack by name")
    if frame.attrs.get("objective") == "cost":
        cur = frame.attrs.get("currency", "USD")
        price = frame.attrs.get("price_per_gpu_hour")
        parts.append(f"{cur}/Mtok cost of a million tokens"
                     + (f" at {price:g} {cur} per GPU-hour" if price else ""))
    if exact:
        parts.append("exact Δ vectorised tier's time / exact engine's − 1")
    if front:
        parts.append("* on the Pareto front of time against memory")
    return "; ".join(parts)


def _context_columns(frame) -> list[str]:
    from .plans import VECTOR_FIELDS
    return [c for c in frame.columns if "." in c and c not in VECTOR_FIELDS
            and c != "parallel.schedule"]


def _rows(frame, exact: bool, front: bool) -> tuple[list[str], list[list[str]]]:
    """Column names and every row's cells as text."""
    extra, hide = _context_columns(frame), hidden_parts(frame)
    gpus = frame["gpus"].nunique() > 1
    cost = frame.attrs.get("objective") == "cost"
    des = "des_iteration_time_s" in frame
    names = ["#", *(["*"] if front else []), "plan", *(["GPUs"] if gpus else []), "iteration",
             "MFU", "memory", *([f"{frame.attrs.get('currency', 'USD')}/Mtok"] if cost else []),
             *(["exact Δ"] if exact else []), *(["DES"] if des else [])]
    rows = []
    for row in frame.to_dict(orient="records"):
        cells = [str(row["rank"]), *(("*" if row["pareto"] else "",) if front else ()),
                 plan_label(row, extra, hide=hide), *([str(row["gpus"])] if gpus else []),
                 format_time(row["iteration_time_s"]), format_percent(row["mfu"]),
                 format_bytes(row["memory_per_device_bytes"])]
        if cost:
            cells.append(f"{row['cost_per_million_tokens']:.3g}")
        if exact:
            e = row.get("exact_error")
            cells.append(f"{e:+.2%}" if e is not None and math.isfinite(e) else "-")
        if des:
            d = row.get("des_iteration_time_s")
            cells.append(format_time(d) if d is not None and math.isfinite(d) else "-")
        rows.append(cells)
    return names, rows


def _table(frame, title: str, exact: bool, front: bool = True, width: int | None = None):
    """A narrow table (no outer box, one space between columns, cells on one line); when the
    columns need more than ``width`` characters, MFU and then memory are left out (the legend
    says so) rather than cut, and then the plan folds onto more lines, so that no figure is
    cut."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    names, rows = _rows(frame, exact, front)
    keep = list(range(len(names)))
    dropped = []
    for name in ("MFU", "memory"):
        if width is None or _width(names, rows, keep) <= width:
            break
        keep.remove(names.index(name))
        dropped.append(name)
    caption = legend(frame, exact, front) + (
        f" ({' and '.join(dropped)} left out at {width} columns: --width, or -f csv)"
        if dropped else "")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 1, 0, 0), caption=caption, caption_justify="left")
    fold = width is not None and _width(names, rows, keep) > width
    for i in keep:
        plan = names[i] == "plan"
        t.add_column(escape(names[i]), justify="left" if plan else "right",
                     no_wrap=not (plan and fold), overflow="fold" if plan and fold else "ellipsis")
    for cells in rows:
        t.add_row(*(escape(cells[i]) for i in keep))
    return t


def _width(names: list[str], rows: list[list[str]], keep: list[int]) -> int:
    return sum(max([len(names[i])] + [len(r[i]) for r in rows]) + 2 for i in keep) - 1


def plan_text_frame(frame):
    """``frame`` for a file: ``plan`` as the plan in words (``TP8 PP16×2 DP8 mbs1 ZeRO1 SP
    selective``), its position in the grid as ``plan_index``; the other columns as they are
    (SI units, named by config path or with the unit in the name)."""
    out = frame.copy()
    extra, hide = _context_columns(frame), hidden_parts(frame)
    labels = [plan_label(row, extra, short=False, hide=hide)
              for row in frame.to_dict(orient="records")]
    out.insert(list(out.columns).index("plan") + 1, "plan_index", out["plan"])
    out["plan"] = labels
    out.attrs = dict(frame.attrs)
    return out


def ranked_table(frame, top: int, width: int | None = None):
    """The ``top`` best plans, with their exact (and DES) times where re-evaluated."""
    title = f"The best {min(top, len(frame))} of {len(frame):,} plans by " \
            f"{frame.attrs.get('objective', 'time')}"
    head = frame.head(top)
    head.attrs = frame.attrs
    return _table(head, title, "exact_iteration_time_s" in frame, width=width)


def pareto_table(frame, limit: int = 15, width: int | None = None):
    """The Pareto front of iteration time against memory per device, fastest first."""
    front = frame[frame["pareto"]].sort_values(["iteration_time_s", "plan"]).head(limit)
    n = int(frame["pareto"].sum())
    title = (f"Pareto front of time against memory per device ({n} plans"
             f"{f', the fastest {limit}' if n > limit else ''})")
    front.attrs = frame.attrs
    return _table(front, title, False, front=False, width=width)


def summary_text(frame, width: int | None = None) -> str:
    """``'13,440 plans: 1,103 evaluated, 12,337 rejected:'`` and one line per reason
    (:func:`grouped_reasons`: reasons of one rule that differ only in their values are one
    line, the most frequent shown); ``width``: each reason wrapped to it, its lines indented
    under its text (None: one line each)."""
    total, rejected = frame.attrs.get("total", len(frame)), frame.attrs.get("rejected", {})
    text = f"{total:,} plans: {len(frame):,} evaluated, {sum(rejected.values()):,} rejected"
    if rejected:
        text += ":"
        groups = grouped_reasons(rejected)
        digits = max(len(f"{count:,}") for _, count, _ in groups)
        for reason, count, variants in groups:
            line = reason + (f" (and {variants - 1} more like it, with other values)"
                             if variants > 1 else "")
            head = f"  {count:>{digits},} × "
            text += "\n" + (head + line if width is None else textwrap.fill(
                line, max(width, len(head) + 20), initial_indent=head,
                subsequent_indent=" " * len(head), break_on_hyphens=False))
    if "exact_error" in frame and frame["exact_error"].notna().any():
        err = frame["exact_error"].dropna().abs()
        text += (f"\nexact engine on the best {len(err)}: |error| median {err.median():.3%}, "
                 f"max {err.max():.3%}")
    return text


#: a number standing alone in a rejection reason (``= 96``, ``16 × 4``, ``(got 1)``), not one
#: inside a name (``ZeRO-2``, ``megatron-core-2024``, ``fp8``)
_VALUE = r"(?<![\w.-])\d[\d,]*(?:\.\d+)?(?![\w-])"


def grouped_reasons(rejected: dict[str, int]) -> list[tuple[str, int, int]]:
    """``(reason, plans, variants)`` per rule: the reasons that read the same once their
    standalone numbers are set aside are one rule (a layer count not divisible by each
    PP × VPP the grid tried), shown by its most frequent reason (the first of equals, in
    ``rejected``'s order), with the plans of all of them; most plans first, ties in
    ``rejected``'s order. The search's frame keeps every reason apart
    (``frame.attrs["rejected"]``)."""
    groups: dict[str, list] = {}
    for reason, count in rejected.items():
        g = groups.setdefault(re.sub(_VALUE, "#", reason), [reason, count, 0, 0])
        if count > g[1]:
            g[0], g[1] = reason, count
        g[2] += count
        g[3] += 1
    order = sorted(groups.values(), key=lambda g: -g[2])   # stable: ties keep their order
    return [(reason, plans, variants) for reason, _, plans, variants in order]


def draw_search(frame, best_result, path: str | Path | None, force: bool = False):
    """Two panels: every evaluated plan as time against memory per device with the Pareto
    front drawn as a staircase and the best plan marked; and the best plan's breakdown (its
    exact result, :func:`ddlsim.plots.draw_breakdown`'s parts); ``path`` None draws without
    writing. Returns the matplotlib Figure."""
    from matplotlib.figure import Figure

    from ..figio import save_figure
    from ..plots import COLOURS, IDLE, _breakdown_parts, _colour

    fig = Figure(figsize=(11.5, 4.8), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[1.6, 1.0])
    gib = 2.0 ** 30
    ax.scatter(frame["memory_per_device_bytes"] / gib, frame["iteration_time_s"], s=6,
               color="#9aa5b1", label=f"{len(frame):,} evaluated plans", linewidths=0)
    front = frame[frame["pareto"]].sort_values("memory_per_device_bytes")
    ax.step(front["memory_per_device_bytes"] / gib, front["iteration_time_s"], where="post",
            color="#1f77b4", marker="o", ms=4, label=f"Pareto front ({len(front)} plans)")
    best = frame.iloc[0]
    ax.scatter([best["memory_per_device_bytes"] / gib], [best["iteration_time_s"]], s=90,
               marker="*", color="#d62728", zorder=3, label="best plan")
    cap = frame["capacity_bytes"].iloc[0] / gib
    ax.axvline(cap, color="#555555", ls="--", lw=0.8, label=f"device memory {cap:.0f} GiB")
    ax.set_xlabel("memory per device (GiB)")
    ax.set_ylabel("iteration time (s)")
    ax.set_title("Plans: time against memory", loc="left")
    ax.legend(frameon=False, fontsize=8)
    parts = _breakdown_parts([best_result])
    bottom = 0.0
    for name, (value,) in parts.items():
        colour = COLOURS[IDLE] if name == "bubble" else _colour(name.removeprefix("exposed "))
        bx.bar([0], [value], 0.5, bottom=bottom, label=name, color=colour, edgecolor="white",
               linewidth=0.5)
        bottom += value
    bx.set_xticks([0], [_label(best)])
    bx.set_ylabel("time per iteration (s)")
    bx.set_title("Best plan, exact engine", loc="left")
    bx.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8,
              reverse=True)
    if path is not None:
        save_figure(fig, path, force=force, what="--plot file", dpi=110)
    return fig


def _label(row: Any) -> str:
    return plan_label(row, short=False).replace(" mbs", "\nmbs")
