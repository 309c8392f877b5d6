"""Tensor-core rates a power-saturated GPU sustains: at the ceilings' own limit, and at another.

A dense GEMM on random data is power-limited on an H100: the board holds the SM clock where
its power meets the limit (docs/compute.md, "Sustained clocks and power limits"). A device's
matmul ceilings (``matmul_efficiency``, ``matmul_efficiency_by_library``) and its attention
figures (``attention_measured``, ``attention_efficiency``) are measurements at the limit
``matmul_power_limit_W``. A device that runs at another ``power_limit_W`` needs what
compute-bound kernels sustain there, measured: ``device.power_limits[power_limit_W]``
(:class:`~ddlsim.config_system.PowerLimitSpec`) gives

* ``matmul_efficiency[dtype]``: the rate, as a fraction of peak, at which a large dense GEMM
  on random data runs at that limit over seconds. It is a ceiling on every GEMM: a GEMM
  takes ``max(t, 2MNK·batch / (peak · rate))``, ``t`` its time at ``matmul_power_limit_W``
  by the shape model (:mod:`.gemm`), so a GEMM that runs below the rate at the higher limit
  (a small or skinny one: fixed costs, quantisation) is not slowed. A dtype not measured at
  the limit takes its rate at ``matmul_power_limit_W`` (the sustained figure there where
  measured, below, else its ceiling) times the smallest ratio of the measured rates to those
  same rates (derived: a power-limited GEMM of any dtype runs at the clock the limit leaves);
* ``attention``: the fused attention kernels' rate at the limit over their rate at
  ``matmul_power_limit_W``, measured on the same kernels: it scales every attention figure
  (those kernels spend power off the tensor cores too, softmax, so a rate cap in FLOP/s does
  not describe them).

An entry at ``matmul_power_limit_W`` itself is the *sustained* figure at the ceilings' own
limit: the ceilings are short-burst maxima (MAMF: a boost-clock burst that never reaches the
limit), the entry what a GEMM holds once the board is saturated at the limit (MSMF). Its
``matmul_efficiency`` caps every GEMM as above, its dtypes only (a dtype it does not list is
capped by its best figure, :meth:`~.device.KernelDevice.sustained_rate`: no ratio is derived,
since some ceilings are already sustained measurements); its ``attention`` is 1 (the same
limit). An entry at another limit then takes its ratios against these sustained figures
(sustained against sustained), not against the burst ceilings.

Memory-bound kernels (element-wise passes, norms, the optimizer, the s² passes of the
non-flash attention core) keep their bandwidth: the measurements behind a limit say nothing
of them. A user's own ``system.compute_efficiency`` and a calibration profile's measured GEMM
efficiencies are measurements on the user's hardware at its limit and are not changed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["power_limit_entry", "clock_ratios", "sustained_rates", "attention_scale"]


def power_limit_entry(dev: Any) -> Any | None:
    """The ``device.power_limits`` entry of the device's ``power_limit_W`` (the sustained
    figures where that is ``matmul_power_limit_W`` itself), or None where there is none.

    Parameters
    ----------
    dev : a :class:`~ddlsim.config_system.DeviceSpec`.

    Returns
    -------
    PowerLimitSpec or None
    """
    if None in (dev.power_limit_W, dev.matmul_power_limit_W):
        return None
    return (dev.power_limits or {}).get(float(dev.power_limit_W))


def _at_own_limit(dev: Any) -> bool:
    return dev.power_limit_W == dev.matmul_power_limit_W


def _reference(dev: Any, ceilings: dict[str, float]) -> dict[str, float]:
    """dtype → the rate at ``matmul_power_limit_W`` another limit's ratios are taken against:
    the sustained figure there where measured, else the ceiling."""
    own = (dev.power_limits or {}).get(float(dev.matmul_power_limit_W))
    return dict(ceilings) | (dict(own.matmul_efficiency) if own is not None else {})


def clock_ratios(dev: Any, entry: Any) -> tuple[dict[str, float], float]:
    """(dtype → rate measured at the limit / the device's rate at ``matmul_power_limit_W``
    (sustained where measured, else its ceiling), the smallest of them: the ratio a dtype not
    measured at the limit takes)."""
    reference = _reference(dev, dev.matmul_efficiency or {})
    ratios = {d: eta / reference[d] for d, eta in entry.matmul_efficiency.items()
              if d in reference}
    return ratios, min(ratios.values())


def sustained_rates(dev: Any, ceilings: dict[str, float]) -> dict[str, float]:
    """dtype → the fraction of peak a dense GEMM sustains at the device's ``power_limit_W``
    (empty where no figure is measured at that limit).

    Parameters
    ----------
    dev : a :class:`~ddlsim.config_system.DeviceSpec`.
    ceilings : dtype → ``η_max`` at ``matmul_power_limit_W`` (the stack's GEMM library's).
        At another limit a dtype the entry does not measure takes its rate at
        ``matmul_power_limit_W`` (sustained where measured, else ``η_max``) × the smallest
        measured ratio; at the ceilings' own limit only the measured dtypes are listed.

    Returns
    -------
    dict : dtype → sustained rate / peak FLOP/s at ``power_limit_W``.
    """
    entry = power_limit_entry(dev)
    if entry is None:
        return {}
    if _at_own_limit(dev):
        return dict(entry.matmul_efficiency)
    _, clock = clock_ratios(dev, entry)
    derived = {d: eta * clock for d, eta in _reference(dev, ceilings).items()}
    return derived | dict(entry.matmul_efficiency)


def attention_scale(dev: Any) -> float:
    """The fused attention kernels' rate at the device's ``power_limit_W`` over their rate at
    ``matmul_power_limit_W`` (1 where the two are the same).

    Parameters
    ----------
    dev : a :class:`~ddlsim.config_system.DeviceSpec`.

    Returns
    -------
    float : the factor on every attention figure (dimensionless).
    """
    entry = power_limit_entry(dev)
    return 1.0 if entry is None or _at_own_limit(dev) else entry.attention
