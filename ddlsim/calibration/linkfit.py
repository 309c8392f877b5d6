"""A node's point-to-point link read from a calibration profile's send/recv fit.

The engines move point-to-point messages (and the discrete-event engine every collective's
flows) over the system's links, not along a profile's curves. Where the link figures of a
preset are themselves a send/recv measurement of the machine (``kvm-2core``), a new profile
of the same machine under other conditions (another rank count on the same cores, another
load) gives the link that goes with it: the α-β segment of the ``sendrecv`` fit at the size
the run sends most, as ``latency_s = α`` and ``bandwidth_Bps = 1 / β``.
"""

from __future__ import annotations

from ..config_system import LinkSpec
from ..errors import ConfigError
from .profile import CalibrationProfile

__all__ = ["measured_link"]


def measured_link(profile: CalibrationProfile, nbytes: float, ranks: int,
                  backend: str = "mpi") -> LinkSpec:
    """The link of the ``sendrecv`` segment covering ``nbytes`` at ``ranks`` ranks.

    Parameters
    ----------
    profile : CalibrationProfile
        A profile with a ``sendrecv`` fit of ``backend`` (the entry of the closest rank
        count, :meth:`CalibrationProfile.alpha_beta`).
    nbytes : float
        Message size, bytes, whose segment is used (e.g. the run's largest message).
    ranks : int
        Ranks the run has (the entry measured nearest to it is used).
    backend : str
        The profile's backend.

    Returns
    -------
    LinkSpec
        ``latency_s`` = the segment's α (s), ``bandwidth_Bps`` = 1 / β (B/s).

    Raises
    ------
    ConfigError
        The segment has no bandwidth term (β = 0).
    """
    alpha, beta = profile.alpha_beta(backend, "sendrecv", nbytes, ranks=ranks)
    if beta <= 0:
        raise ConfigError(f"the {backend} sendrecv fit at {nbytes:.0f} B has beta = {beta}: "
                          f"no bandwidth to read; calibrate sizes above it")
    return LinkSpec(bandwidth_Bps=1.0 / beta, latency_s=alpha,
                    source=f"{backend} sendrecv fit at {nbytes:.0f} B, {ranks} ranks")
