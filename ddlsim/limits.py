"""Every bound ddlsim puts on its input, in one place, each with its reason.

Two kinds:

* **Plausibility bounds** on values with a physical meaning (:data:`BOUNDS`). A value outside
  ``[low, high]`` is refused by the config validator with the reason; a value outside
  ``[usual_low, usual_high]`` is accepted with a :class:`~ddlsim.errors.DDLSimWarning` (see
  :func:`warn_unusual`). Hard bounds sit far beyond any real system, so they only catch unit
  slips (``bandwidth_Bps: 200`` meaning 200 B/s) and nonsense (``num_hidden_layers: 1e9``).
* **Work budgets** (:class:`Limits`): what a run may cost, estimated from the config before
  any work starts and refused by :func:`check_work` with the estimate and the ``--limit``
  option that raises the budget. The defaults keep every accepted run under about 1 GB of
  memory and a minute on one core of the 2-core CI machine; the measurements behind each are
  beside it. The estimates are :mod:`ddlsim.workcount`'s (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, DDLSimWarning, WorkTooLargeError, did_you_mean
from .workcount import estimate_work, topology_links, trace_ops

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["Bound", "BOUNDS", "check_bound", "warn_unusual", "Limits", "check_work",
           "estimate_work", "topology_links", "trace_ops", "check_topology", "check_budget"]


@dataclass(frozen=True)
class Bound:
    """Refused outside ``[low, high]`` (``why``); warned outside ``[usual_low, usual_high]``
    (``unusual``). ``None`` is no bound. ``unit`` names the SI unit in messages."""

    low: float | None
    high: float | None
    why: str
    usual_low: float | None = None
    usual_high: float | None = None
    unusual: str = ""
    unit: str = ""


MB_PER_S = 1e6 / 8  # 1 Mb/s in B/s

BOUNDS: dict[str, Bound] = {
    "bandwidth": Bound(
        MB_PER_S, 1e15, "below 1 Mb/s no network or bus built since the 1980s runs (a bare "
        "number is in B/s: write '200 Gb/s', not 200); above 1 PB/s is >100× the fastest HBM "
        "(8 TB/s, B200)", unit="B/s"),
    "nic_bandwidth": Bound(
        MB_PER_S, 1e15, "as for any bandwidth", usual_low=1e9 / 8,
        unusual="below 1 Gb/s, slower than any NIC of a training cluster (100 Mb/s Ethernet?)",
        unit="B/s"),
    "latency": Bound(
        None, 1.0, "a per-message latency over 1 s is no interconnect (a bare number is in "
        "seconds: write '5 us', not 5)", usual_high=1e-3,
        unusual="over 1 ms, slower than a WAN hop; data-centre latencies are 1-10 us",
        unit="s"),
    "devices": Bound(
        None, 1e7, "more than 10^7 devices is 100× the largest cluster built (~10^5 GPUs)"),
    "devices_per_node": Bound(
        None, 4096, "more than 4,096 devices in one node (NVL72 holds 72, NVL576 576)"),
    "nics_per_node": Bound(None, 4096, "more than 4,096 NICs in one node (DGX nodes have 8-10)"),
    "sm_count": Bound(None, 100_000, "more than 100,000 SMs on one device (an H100 has 132)"),
    "microbatches": Bound(
        None, 1e6, "more than 10^6 micro-batches per iteration (Megatron-LM's largest runs use "
        "a few hundred to a few thousand)"),
    "global_batch_size": Bound(
        None, 1e9, "more than 10^9 samples per iteration (the largest published batches are "
        "~10^4 sequences)"),
    "micro_batch_size": Bound(None, 1e6, "more than 10^6 samples per micro-batch"),
    "layers": Bound(
        None, 10_000, "more than 10,000 layers is ~80× the deepest published transformer "
        "(128 layers, Megatron-LM 1T; PaLM 540B has 118)"),
    "hidden_size": Bound(
        None, 2**20, "a hidden size over 2^20 is ~40× the widest published model (25,600, "
        "Megatron-LM 1T)"),
    "intermediate_size": Bound(None, 2**23, "an FFN size over 2^23 (8× the widest hidden "
                                            "size allowed, times 4)"),
    "heads": Bound(None, 2**20, "more attention heads than the widest hidden size allowed"),
    "vocab_size": Bound(
        None, 1e8, "a vocabulary over 10^8 tokens is ~400× the largest in use (256k, Gemma)"),
    "seq_length": Bound(
        None, 1e8, "a sequence over 10^8 tokens is 10× the longest context offered (10M, "
        "Llama 4 Scout)"),
    "parallel_size": Bound(None, 1e7, "a parallel dimension over 10^7, the most devices "
                                      "allowed"),
    "memory_bytes": Bound(
        2.0**20, 1e15, "device memory under 1 MiB or over 1 PB (an H200 has 141 GB; a bare "
        "number is in bytes: write '80 GiB')", unit="B"),
    "bucket_bytes": Bound(1.0, 1e15, "a gradient bucket over 1 PB", unit="B"),
    "flops": Bound(
        1e6, 1e18, "under 1 MFLOP/s or over 1 EFLOP/s per device (a B200 peaks at ~10^16 "
        "FLOP/s at fp4; a bare number is in FLOP/s: write '312 TFLOP/s')", unit="FLOP/s"),
    "oversubscription": Bound(
        1.0, 1000.0, "an oversubscription over 1000:1 leaves no network", usual_high=16.0,
        unusual="over 16:1; production fabrics are 1:1 to 4:1"),
    "torus_rank": Bound(None, 8, "a torus of more than 8 dimensions (TPU v4 uses 3, "
                                 "Fugaku's Tofu 6)"),
}


def check_bound(value: Any, name: str) -> Any:
    """``value`` if it lies inside the hard bounds of ``BOUNDS[name]``, else ValueError with
    the reason (the config validator turns it into a one-paragraph :class:`ConfigError`)."""
    b = BOUNDS[name]
    unit = f" {b.unit}" if b.unit else ""
    if b.low is not None and value < b.low:
        raise ValueError(f"{_fmt(value)}{unit} is below the plausible minimum {_fmt(b.low)}{unit}: "
                         f"{b.why}")
    if b.high is not None and value > b.high:
        raise ValueError(f"{_fmt(value)}{unit} is above the plausible maximum "
                         f"{_fmt(b.high)}{unit}: {b.why}")
    return value


def _fmt(x: float) -> str:
    """1e7 → '10,000,000'; 125000.0 → '125,000'; 0.5 → '0.5'; 10**400 → '~10^400'."""
    if isinstance(x, int) and abs(x) >= 10**16:
        return f"~10^{int(abs(x).bit_length() * math.log10(2))}"
    if math.isfinite(x) and x == int(x) and abs(x) < 1e16:
        return f"{int(x):,}"
    return f"{x:g}"


def _unusual(field: str, value: float, name: str) -> None:
    b = BOUNDS[name]
    if ((b.usual_low is not None and value < b.usual_low)
            or (b.usual_high is not None and value > b.usual_high)):
        unit = f" {b.unit}" if b.unit else ""
        warnings.warn(f"{field} = {_fmt(value)}{unit} is unusual: {b.unusual}; check the value and "
                      "its unit", DDLSimWarning, stacklevel=4)


def warn_unusual(cfg: RunConfig) -> None:
    """Emit a :class:`DDLSimWarning` for each merely unusual value of ``cfg``, naming the
    field, the value and why it is unusual."""
    s = cfg.system
    _unusual("system.nic.bandwidth_Bps", s.nic.bandwidth_Bps, "nic_bandwidth")
    _unusual("system.intra_node.bandwidth_Bps", s.intra_node.bandwidth_Bps, "nic_bandwidth")
    for field, value in (("system.nic.latency_s", s.nic.latency_s),
                         ("system.intra_node.latency_s", s.intra_node.latency_s),
                         ("system.network.switch_latency_s", s.network.switch_latency_s)):
        _unusual(field, value, "latency")
    _unusual("system.network.oversubscription", s.network.oversubscription, "oversubscription")


# ---------------------------------------------------------------------------- work budgets
@dataclass(frozen=True)
class Limits:
    """Work budgets, each checked against an estimate before any work starts.

    Attributes
    ----------
    pipeline_steps
        Pipeline steps of all stages, ``PP · (2 · micro-batches · chunks + 1)``. The step tables
        take ~350 bytes a step (GPT-3 175B with 10^5 micro-batches: 3.2·10^6 steps, 1.15 GB,
        4 s), so 2·10^6 keeps them under ~0.8 GB.
    ranks
        Ranks (TP·PP·DP). Each costs ~130 bytes in rank tables and groups (10^7 ranks took
        1.3 GB and 5 s in the analytical engine), so 4·10^6 keeps them under ~0.6 GB.
    topology_links
        Directed links of the cluster graph, which both engines build. The array builder
        (``topologies/builder.py``, 2026-11-29) takes under 1 µs and ~350 bytes a link to
        build and route (DGX H100 × 16,384 nodes, GPT-3 175B on 131,072 GPUs: 1.3·10^6
        links, 0.8 s and 455 MB for the graph, 2.1-2.5 s and 365 MB for the whole analytical
        prediction), so 2.5·10^6 stays under ~1 GB and a few seconds before an engine
        starts. (With networkx's dicts it was ~33 µs and ~0.6 kB a link.)
    trace_ops
        Ops of the trace the analytical engine times, Σ over rank classes of the ops of every
        step. Where the engine's max-plus solver cannot time the steps (ZeRO-3: the compute
        stream waits for one all-gather per layer) its scheduler takes ~6.5 µs an op, trace
        build included (GPT-3 with 9,984 layers, ZeRO-3, 12 micro-batches: 1.8·10^6 ops, 12 s,
        195 MB); pipelines the solver times take ~0.05 µs (Megatron-LM 1T: 1.4·10^6 ops, 0.08 s
        CPU for the whole prediction, measured for issue 13). 5·10^6 is at most ~35 s.
    sweep_runs
        Combinations of a ``sweep`` (the product of the ranges' lengths), each one exact
        prediction (5-50 ms for the examples), so 10^4 is a few minutes at most.
    search_plans
        Plans of a ``search`` grid (the product of its axes' lengths). The vectorised tier
        holds ~115 bytes a plan (GPT-3 175B, 1.34·10^6 plans: 234 MB, 3.6 s; 1.34·10^7:
        1.54 GB, 7.8 s; 2026-11-29), so 5·10^6 is about 0.6 GB.
    axis_values
        Values of one ``--set-range`` / ``--axis`` / ``search.axes`` entry, counted before it
        is expanded (``1:100000000`` is 10^8 values; 10^5 take ~5 MB and 0.1 s to read).
    fit_segments
        ``calibrate fit --max-segments``: one numpy pass per segment count and size (25
        sizes: +0.4 s at 100 segments, +2.2 s at 1,000; 10^6 on 50 rows: 59 s, 2.2 GB); a
        measured curve has a handful of regimes, so 100 is generous.
    fit_bootstrap
        ``calibrate fit --bootstrap`` resamples, ~2.7 kB each per curve (25 sizes: 2·10^4 took
        +0.7 s and +48 MB), so 10^5 stays near 0.3 GB a curve.
    bench_samples
        ``calibrate compute``: timed calls, (``--warmup`` + ``--reps``) × shapes × dtypes
        (+ attention shapes × dtypes). A timed sample repeats its call for at least 1 ms; the
        default shapes (32-1024, 10 GEMMs, ~13 GFLOP per round) take ~0.13 s a round on one
        core at ~100 GFLOP/s (5 reps: 18 s and 107 MB on the loaded 2-core machine,
        2026-11-29; 100 reps: 93 s), so 5,000 is about a minute at the default shapes.
        ``--reps 10^12`` asked for a 8 TB array of samples.
    des_rank_ops
        DES: ops executed over all ranks, Σ ranks × ops per step. The DES runs ~0.4-4 µs per
        rank-op since 2026-11-28 (GPT-3 175B on 1,024 GPUs: 3.8·10^6 in 2.0 s; Megatron-LM 1T
        on 3,072 GPUs: 7.6·10^7 in 46 s and 0.93 GB; the slowest seen, Llama-2 70B with
        sequence parallelism and 20 virtual stages on 64 GPUs, README's `--engine both`
        example: 7.2·10^6 in 28 s and 0.29 GB; before that day 4-9 µs, and the limit 7·10^6
        refused that example). The bundled GPT-3 175B example has grown to 1.32·10^7 (the
        asynchronous TP all-reduces' ops: 6.2 s on a loaded machine, 2026-11-29), so 2·10^7,
        at most about a minute at the slowest rate seen.
    """

    pipeline_steps: int = 2_000_000
    ranks: int = 4_000_000
    topology_links: int = 2_500_000
    trace_ops: int = 5_000_000
    des_rank_ops: int = 20_000_000
    sweep_runs: int = 10_000
    search_plans: int = 5_000_000
    axis_values: int = 100_000
    fit_segments: int = 100
    fit_bootstrap: int = 100_000
    bench_samples: int = 5_000

    @classmethod
    def from_strings(cls, items: list[str] | tuple[str, ...] | None) -> Limits:
        """Limits from ``["name=value", ...]`` (``--limit des_rank_ops=1e8``).

        Raises
        ------
        ConfigError
            For an item without ``=``, an unknown name (with the names allowed and the
            closest one), a name given twice or a value that is not a positive whole number.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, int] = {}
        for item in items or ():
            name, sep, raw = str(item).partition("=")
            name = name.strip()
            if not sep:
                raise ConfigError(f"--limit {item!r} must look like NAME=VALUE, e.g. "
                                  f"des_rank_ops=1e8; names: {', '.join(names)}")
            if name not in names:
                raise ConfigError(f"--limit {item!r}: unknown limit {name!r}"
                                  f"{did_you_mean(name, names)}; allowed: {', '.join(names)}")
            if name in values:
                raise ConfigError(f"--limit {name} is given twice; give each limit once")
            values[name] = _positive_count(raw, item)
        return cls(**values)


def _positive_count(raw: str, item: str) -> int:
    try:
        value = float(raw.strip().replace("_", ""))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise ConfigError(f"--limit {item!r}: the value must be a positive whole number "
                          f"(e.g. 2000000 or 2e6); got {raw.strip()!r}")
    return int(value)


_WHAT = {"pipeline_steps": "pipeline steps (PP × (2 × micro-batches × chunks + 1))",
         "ranks": "ranks (TP × PP × DP)",
         "topology_links": "directed links in the cluster graph",
         "trace_ops": "operations in the trace (Σ over rank classes of the ops of every step)",
         "des_rank_ops": "operations executed by the DES over all ranks",
         "sweep_runs": "combinations in the sweep (the product of the ranges' lengths)",
         "search_plans": "plans in the search grid (the product of the axes' lengths)",
         "axis_values": "values in one range or axis",
         "fit_segments": "α-β segments per curve (--max-segments)",
         "fit_bootstrap": "bootstrap resamples per curve (--bootstrap)",
         "bench_samples": "timed calls ((--warmup + --reps) × shapes × dtypes)"}


def check_work(cfg: RunConfig, engine: str, limits: Limits | None = None,
               workload: Any = None) -> None:
    """Refuse a run whose estimated work exceeds a budget of ``limits``, before it starts.

    Parameters
    ----------
    cfg : the validated run config.
    engine : ``"analytical"`` or ``"des"``.
    limits : the budgets (default :class:`Limits`()).
    workload : the trace of ``cfg``, if built: its ops are counted exactly against
        ``trace_ops`` and, with ``engine="des"``, ``des_rank_ops`` (call once before building
        the trace, once after).

    Raises
    ------
    WorkTooLargeError
        Naming the budget, the estimate, the limit and the ``--limit`` option to raise it.
    """
    limits = limits or Limits()
    _refuse_over(estimate_work(cfg, engine), limits)
    if workload is not None:
        per_class, per_rank = trace_ops(workload)
        _refuse_over({"trace_ops": per_class}, limits)
        if engine == "des":
            _refuse_over({"des_rank_ops": per_rank}, limits)


def check_topology(spec: Any, limits: Limits | None = None) -> None:
    """Refuse to build the graph of ``spec`` (a validated system section or topology spec,
    :func:`ddlsim.topologies.spec.parse_spec`) when its estimated links exceed
    ``limits.topology_links``: for ``ddlsim topology show``.

    Raises
    ------
    WorkTooLargeError
        With the estimate, the limit and the ``--limit`` option to raise it.
    """
    _refuse_over({"topology_links": topology_links(spec)}, limits or Limits())


def check_budget(work: dict[str, int], limits: Limits | None = None, what: str = "") -> None:
    """Refuse ``work`` (``{budget name: estimate}``, counted before anything is built) when
    an estimate exceeds its budget in ``limits`` (default :class:`Limits`()).

    Parameters
    ----------
    work : estimates in the units of :class:`Limits` (ranks, links, plans, values, …).
    limits : the budgets.
    what : what is estimated, for the message (e.g. ``"--set-range 'train.x=1:9'"``).

    Raises
    ------
    WorkTooLargeError
        Naming the budget, the estimate, the limit and the ``--limit`` option to raise it.
    """
    _refuse_over(work, limits or Limits(), what)


def _refuse_over(work: dict[str, int], limits: Limits, what: str = "") -> None:
    for name, estimate in work.items():
        limit = getattr(limits, name)
        if estimate > limit:
            where = f"{what}: " if what else ""
            raise WorkTooLargeError(
                f"{where}this run would take too much work: {_fmt(estimate)} {_WHAT[name]}, over "
                f"the limit of {limit:,} (set so that a run stays under about 1 GB and a "
                f"minute). Reduce it, or raise the limit with --limit "
                f"{name}={_round_up(estimate)} (Python: limits=Limits({name}=...)).")


def _round_up(n: int) -> str:
    """A round number at least ``n``, for the suggestion: 3,140,000 → '4e6', 1,024 → '2000'."""
    n = max(int(n), 1)
    exp = int(math.log10(n))
    exp -= 10**exp > n  # log10 of a huge int may round up
    lead = -(-n // 10**exp)
    if lead == 10:
        lead, exp = 1, exp + 1
    return f"{lead}e{exp}" if exp >= 6 else str(lead * 10**exp)
