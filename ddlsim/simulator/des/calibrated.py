"""Calibrated collectives in the DES: the algorithm's flows, stretched to the measured time.

With a calibration profile the analytical engine times a collective by the profile's fitted
curve (:meth:`CostModel.choice`, ``"<backend> (calibrated)"``). The DES must price the same
physics, so it runs the same algorithm's flows (its links, its phases, its sharing with
other traffic) stretched by one factor ``s = t_measured / t_alone``: every phase's bytes and
every step latency × ``s``. Run alone, phase ``k`` took ``b_k / r_k + l_k`` (bytes per flow
over its max-min rate, plus its latency); stretched it takes ``s · (b_k / r_k + l_k)``, so
the whole run alone takes ``s · t_alone = t_measured``, exactly the analytical engine's
time. Next to other traffic the stretched flows share links as the algorithm's flows do:
a measured collective slower than its link model (a shared-memory copy, a reduction on the
CPU, ranks waiting for a core) occupies its links in proportion.

``t_alone`` is the DES's own isolated timeline of the template (:mod:`.express`) where its
phases are uniform, else the closed form of the algorithm (:class:`CollectiveChoice`'s
``closed_form_s``; equal to the DES alone wherever the engines agree, docs/engines.md). A
template that takes no time alone (no links, no latency) becomes one pure delay of the
measured time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .express import isolated_profile
from .templates import FlowTemplate, PhaseFlows

__all__ = ["alone_seconds", "stretch_template"]


def alone_seconds(template: FlowTemplate, nbytes: float, capacity_Bps: np.ndarray
                  ) -> float | None:
    """Seconds one issue of ``template`` moving ``nbytes`` takes on idle links.

    Parameters
    ----------
    template : FlowTemplate
        A collective's phases and flows.
    nbytes : float
        Bytes of one issue (nccl-tests convention), B.
    capacity_Bps : numpy.ndarray
        Link capacities of the flow network, B/s (its padding link last).

    Returns
    -------
    float or None
        ``sum_k repeat_k * (bytes_per_byte_k * nbytes / rate_k + latency_k)``, seconds, or
        None where a phase's flows would not all move at one rate with one latency
        (:func:`.express.isolated_profile`).
    """
    profile = isolated_profile(template, capacity_Bps)
    if profile is None:
        return None
    return sum(ph.repeat * (ph.bytes_per_byte * nbytes * iso.seconds_per_byte
                            + iso.step_latency_s)
               for ph, iso in zip(template.phases, profile))


def stretch_template(template: FlowTemplate, measured_s: float, alone_s: float
                     ) -> FlowTemplate:
    """``template`` with every phase's bytes and latency × ``measured_s / alone_s``.

    Parameters
    ----------
    template : FlowTemplate
        The algorithm's flows (bytes per collective byte).
    measured_s : float
        Seconds the calibration profile gives one issue, s.
    alone_s : float
        Seconds the template takes alone for the same issue, s.

    Returns
    -------
    FlowTemplate
        A template whose run alone takes ``measured_s``; where ``alone_s`` is not positive
        and finite, one phase of no flows whose latency is ``measured_s``.
    """
    name = f"{template.name} (calibrated)"
    if not (np.isfinite(alone_s) and alone_s > 0):
        n = template.instances
        delay = PhaseFlows(np.empty((0, 1), dtype=np.int64), np.empty(0), np.zeros(n + 1,
                           dtype=np.int64), np.full(n, measured_s), 0.0, 1)
        return FlowTemplate(name, template.members, (delay,))
    s = measured_s / alone_s
    phases = tuple(replace(ph, bytes_per_byte=ph.bytes_per_byte * s,
                           latency_s=ph.latency_s * s) for ph in template.phases)
    return FlowTemplate(name, template.members, phases)
