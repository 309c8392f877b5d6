"""Text and JSON reports of the ``ddlsim traces`` commands."""

from __future__ import annotations

import json

__all__ = ["render_measured", "measured_payload"]


def measured_payload(r) -> dict:
    """The JSON mapping of a :class:`~ddlsim.traces.replay.MeasuredPrediction` (SI units)."""
    m, b = r.measured, r.binding
    return {
        "trace": m.source,
        "measured": {"placement": m.placement, "step_s": m.step_s, "window_s": m.window_s,
                     "profiler_overhead_s": m.overhead_s,
                     "profiler_overhead_events": m.overhead_events, "compute_s": m.compute_s,
                     "communication_s": m.communication_s, "unlabelled_s": m.unlabelled_s,
                     "layers": m.layers, "microbatches": m.microbatches,
                     "labels": [{"phase": k.phase, "part": k.part, "in_layer": k.in_layer,
                                 "seconds": v} for k, v in m.seconds.items()]},
        "ops": [{"op": name, "measured_s": b.measured_s[name], "modelled_s": b.modelled_s[name],
                 "factor": b.factor[name]} for name in sorted(b.measured_s)],
        "unbound": [{"phase": k.phase, "part": k.part, "seconds": v} for k, v in b.unbound.items()],
        "unmeasured_ops": list(b.unmeasured),
        "profiled": r.profiled.to_dict(), "profiled_error": r.profiled_error,
        "target": r.target.to_dict(),
    }


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def render_measured(r, fmt: str, changed: bool) -> str:
    """``fmt`` ``json`` (:func:`measured_payload`) or ``table``: the step measured and
    re-predicted, the target predicted, and each op's measured and modelled seconds."""
    if fmt == "json":
        return json.dumps(measured_payload(r), indent=1) + "\n"
    m, b = r.measured, r.binding
    placed = "module stack" if m.placement == "modules" else "FSDP2's per-block ranges"
    lines = [f"profile {m.source}: {m.layers} layers, {m.microbatches} micro-batch(es), "
             f"{m.ops} outermost ops, placed by {placed}",
             f"  measured step          {_ms(m.step_s)} (compute {_ms(m.compute_s)}, "
             f"communication {_ms(m.communication_s)}, unlabelled {_ms(m.unlabelled_s)})",
             *([f"  profiler overhead      {_ms(m.overhead_s)} taken off the profiled "
                f"{_ms(m.window_s)} ({m.overhead_events} events)"] if m.overhead_events else []),
             f"  profiled plan, ddlsim  {_ms(r.profiled.iteration_time_s)} "
             f"({r.profiled_error * 100:+.2f} % from the measured step)"]
    if changed:
        t = r.target.breakdown
        comm = sum(t.exposed_comm_s.values())
        lines.append(f"  target plan, ddlsim    {_ms(r.target.iteration_time_s)} (compute "
                     f"{_ms(t.compute_s)}, optimizer {_ms(t.optimizer_s)}, exposed "
                     f"communication {_ms(comm)}, bubble {_ms(t.bubble_s)}"
                     + (f", waiting for the host {_ms(t.host_s)}" if t.host_s else "") + "; "
                     f"{r.target.config['parallel']['data_parallel_size']} data-parallel ranks)")
    lines += ["", f"{'op':32} {'measured':>12} {'ddlsim model':>12} {'ratio':>8}"]
    for name in sorted(b.measured_s):
        k = b.factor[name]
        lines.append(f"{name:32} {_ms(b.measured_s[name]):>12} {_ms(b.modelled_s[name]):>12} "
                     f"{'-' if k is None else f'{k:.2f}':>8}")
    if b.unbound:
        lines.append("measured but in no op of the trace (left out): " + ", ".join(
            f"{k.phase} {k.part} {_ms(v)}" for k, v in b.unbound.items()))
    if b.unmeasured:
        lines.append("ops the profile did not measure (ddlsim's model): " + ", ".join(b.unmeasured))
    return "\n".join(lines) + "\n"


def render_result(result, fmt: str, what: str) -> str:
    """One prediction of a trace read from files: ``json`` (the result's mapping) or a
    ``table`` of the iteration time and its breakdown."""
    if fmt == "json":
        r = result
        doc = {"source": what, "engine": r.engine, "iteration_time_s": r.iteration_time_s,
               "breakdown": r.breakdown.to_dict(), "comm_bytes": dict(r.comm_bytes),
               "world_size": r.world_size, "critical_class": r.critical_class,
               "per_class_time_s": dict(r.per_class_time_s), "algorithms": dict(r.algorithms),
               "memory_per_device_bytes": None}  # a trace file does not say
        return json.dumps(doc, indent=1) + "\n"
    b = result.breakdown
    lines = [f"{what}: {result.iteration_time_s * 1e3:.3f} ms ({result.engine})",
             f"  compute: {_ms(b.compute_s)}", f"  optimizer: {_ms(b.optimizer_s)}"]
    lines += [f"  exposed {k} communication: {_ms(v)}" for k, v in b.exposed_comm_s.items() if v]
    lines.append(f"  bubble: {_ms(b.bubble_s)}")
    if b.host_s:
        lines.append(f"  waiting for the host: {_ms(b.host_s)}")
    return "\n".join(lines) + "\n"


def render_replay(result, measured_s: float, iterations: int, fmt: str, what: str) -> str:
    """A replayed MPI log: the measured span beside the prediction, in total and per
    iteration, with the prediction's breakdown (``table``) or as JSON."""
    error = result.iteration_time_s / measured_s - 1.0 if measured_s > 0 else None
    if fmt == "json":
        doc = json.loads(render_result(result, "json", what))
        doc.update(measured_span_s=measured_s, iterations=iterations,
                   predicted_per_iteration_s=result.iteration_time_s / iterations,
                   measured_per_iteration_s=measured_s / iterations, error=error)
        return json.dumps(doc, indent=1) + "\n"
    head = (f"{what}: measured {_ms(measured_s / iterations)}, predicted "
            f"{_ms(result.iteration_time_s / iterations)} per iteration"
            + (f" ({error * 100:+.1f} %)" if error is not None else "")
            + f" over {iterations} iteration(s)\n")
    return head + render_result(result, "table", "  replayed span")
