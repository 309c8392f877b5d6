"""Calibration profiles: the versioned YAML document (its records: :mod:`.profiledoc`) and
the query API the engines use.

A profile holds, per (backend, operation, scope, rank count), piecewise α-β segments fitted to
measurements (or built from published figures, each with its source), and per (backend,
device, kind, dtype) a compute-efficiency curve. Everything is SI: seconds, bytes, s/B,
FLOP/s.

**Other rank counts.** A fit measured on *n* ranks predicts *n′* ranks only through an
algorithm model. The profile keeps the measured rank count and converts through the bus
bandwidth of nccl-tests, which is meant to be independent of the rank count
(NVIDIA/nccl-tests doc/PERFORMANCE.md): ``t(n′) = t(n) / f(n) × f(n′)`` with *f* the busbw
factor (:func:`~ddlsim.calibration.schema.busbw_factor`). This is exact for the bandwidth
term of ring algorithms; the latency term of real algorithms grows with *n′* (ring: 2(n′−1)
steps, tree: log₂ n′), which this scaling does not capture — calibrate at the rank count you
predict when small messages matter. The closest measured rank count is used (ties: the
larger).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ValidationError

from ..errors import ConfigError, DDLSimWarning
from ..textio import MAX_DATA_BYTES, read_text
from .outputs import write_yaml
from ..documents import parse_yaml
from .schema import OPS, CalibrationError, CalibrationLookupError, busbw_factor
from .profiledoc import (CommEntry, ComputeEntry, GemmShapeTime, Points, ProfileDoc,
                         Segment)   # the document's records, re-exported here

__all__ = ["Segment", "Points", "CommEntry", "ComputeEntry", "GemmShapeTime", "ProfileDoc",
           "CalibrationProfile",
           "CommPrediction", "PROFILE_VERSION", "list_default_profiles", "load_default_profile"]

#: Most values a profile document may hold: a profile has a few hundred (segments, intervals,
#: provenance with its skipped rows); PyYAML composes ~10^4 values a second, so a refusal
#: takes at most ~20 s.
MAX_PROFILE_VALUES = 200_000

PROFILE_VERSION = 1
Scope = Literal["intra", "inter", "any"]
_Z = {0.5: 0.6744897501960817, 0.68: 0.994457883209753, 0.8: 1.2815515655446004,
      0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


@dataclass(frozen=True)
class CommPrediction:
    """A predicted time and how it was obtained (entry, segment, rank scaling)."""

    time_s: float
    alpha_s: float
    beta_s_per_B: float
    nbytes: float
    ranks: int
    measured_ranks: int
    rank_scale: float
    scope: str
    segment: int
    entry: CommEntry


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level!r}")
    if level in _Z:
        return _Z[level]
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


class CalibrationProfile:
    """Query a calibration profile. Build with :meth:`load` or :meth:`from_dict`."""

    def __init__(self, doc: ProfileDoc):
        self.doc = doc
        self._warned: set[tuple] = set()  # compute fits said unusable, once each

    # ---------------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, data: object, where: str = "profile") -> "CalibrationProfile":
        """Validate a mapping; errors name the field, the value and what is allowed."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a calibration profile must be a YAML mapping, got "
                              f"{type(data).__name__} (results files such as CSVs go through "
                              "`ddlsim calibrate fit RESULTS -o profile.yaml` first)")
        if data.get("version") != PROFILE_VERSION:
            raise ConfigError(f"{where}: unsupported calibration profile version "
                              f"{data.get('version')!r}; this ddlsim reads version "
                              f"{PROFILE_VERSION}")
        try:
            return cls(ProfileDoc.model_validate(data))
        except ValidationError as exc:
            msgs = [f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {_short(e.get('input'))})"
                    for e in exc.errors()[:3]]
            raise ConfigError(f"{where}: invalid calibration profile: " + "; ".join(msgs)) \
                from None

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationProfile":
        """Read and validate a profile YAML file.

        The file is read through :func:`ddlsim.textio.read_text` (a regular UTF-8 file of at
        most :data:`~ddlsim.textio.MAX_DATA_BYTES`) and parsed by
        :func:`ddlsim.documents.parse_yaml`: duplicate keys, deep nesting and alias expansion
        beyond :data:`MAX_PROFILE_VALUES` values are refused before the document is built, so
        no file can make loading slow or deep.
        """
        text = read_text(path, what="calibration profile", max_bytes=MAX_DATA_BYTES)
        return cls.from_dict(parse_yaml(text, str(path), max_nodes=MAX_PROFILE_VALUES),
                             where=str(path))

    def to_dict(self) -> dict:
        """The YAML-ready mapping (unset optional fields omitted, floats to 7 digits)."""
        return _round(self.doc.model_dump(mode="json", exclude_none=True))

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the profile; refuses to overwrite an existing file unless ``force``."""
        return write_yaml(path, self.to_dict(), force)

    # --------------------------------------------------------------------------- queries
    @property
    def backends(self) -> tuple[str, ...]:
        """Backends with communication entries, sorted."""
        return tuple(sorted({e.backend for e in self.doc.comm}))

    def ops(self, backend: str) -> tuple[str, ...]:
        """Operations calibrated for ``backend``, in :data:`OPS` order."""
        have = {e.op for e in self.doc.comm if e.backend == backend}
        if not have:
            raise CalibrationLookupError(f"backend {backend!r} is not in this profile; it has "
                                   f"{', '.join(self.backends) or 'no communication entries'}")
        return tuple(op for op in OPS if op in have)

    def _entry(self, backend: str, op: str, ranks: int | None, scope: Scope) -> CommEntry:
        if scope not in ("intra", "inter", "any"):
            raise ConfigError(f"scope must be 'intra', 'inter' or 'any', got {scope!r}")
        found = [e for e in self.doc.comm if e.backend == backend and e.op == op
                 and e.variant == "" and (scope == "any" or e.scope == scope)]
        if not found:
            have = sorted({(e.backend, e.op, e.scope) for e in self.doc.comm if e.variant == ""})
            raise CalibrationLookupError(f"no calibration for backend={backend!r} op={op!r} "
                                   f"scope={scope!r}; the profile has (backend, op, scope): "
                                   f"{', '.join(map(str, have)) or 'nothing'}")
        if ranks is None:
            return max(found, key=lambda e: (e.ranks, e.scope == "inter"))
        return min(found, key=lambda e: (abs(math.log(ranks / e.ranks)), -e.ranks,
                                         e.scope != "inter"))

    def predict(self, backend: str, op: str, nbytes: float, ranks: int,
                scope: Scope = "any") -> CommPrediction:
        """Predicted time of ``op`` on ``nbytes`` (nccl-tests size convention) and ``ranks``,
        with the entry, segment and rank scaling used (see the module docstring)."""
        _check_query(nbytes, ranks)
        e = self._entry(backend, op, ranks, scope)
        i, seg = e.segment(nbytes)
        scale = busbw_factor(op, ranks) / busbw_factor(op, e.ranks) if ranks != e.ranks else 1.0
        t = (seg.alpha_s + seg.beta_s_per_B * nbytes) * scale
        exact = e.size_time_s(nbytes) if ranks == e.ranks else None
        t = t if exact is None else exact
        return CommPrediction(t, seg.alpha_s, seg.beta_s_per_B, float(nbytes), int(ranks),
                              e.ranks, scale, e.scope, i, e)

    def measured_range(self, backend: str, op: str, ranks: int,
                       scope: Scope = "any") -> tuple[float, float]:
        """(smallest, largest) size in bytes measured by the entry :meth:`predict` uses for
        ``backend``, ``op``, ``ranks`` and ``scope`` (see :attr:`CommEntry.measured_bytes`).
        The cost model uses a profile only inside this range."""
        _check_query(0, ranks)
        return self._entry(backend, op, ranks, scope).measured_bytes

    def time_s(self, backend: str, op: str, nbytes: float, ranks: int,
               scope: Scope = "any") -> float:
        """Predicted time in seconds (:meth:`predict` without the explanation)."""
        return self.predict(backend, op, nbytes, ranks, scope).time_s

    def interval_s(self, backend: str, op: str, nbytes: float, ranks: int,
                   scope: Scope = "any", level: float = 0.95) -> tuple[float, float]:
        """Interval of the predicted time at ``level``, propagated from the parameters.

        ``Var t = σ_α² + S²σ_β² + 2Sρσ_ασ_β`` (bootstrap standard errors and correlation),
        normal quantile at ``level``, lower end clipped at 0, then the rank scaling.
        """
        p = self.predict(backend, op, nbytes, ranks, scope)
        seg = p.entry.segments[p.segment]
        if seg.alpha_se_s is None or seg.beta_se_s_per_B is None:
            raise CalibrationError(f"{backend} {op} ({p.scope}, {p.measured_ranks} ranks) has no "
                                   "parameter uncertainty (built from published figures, or "
                                   "fitted without bootstrap); only time_s is available")
        rho = seg.corr_alpha_beta or 0.0
        var = (seg.alpha_se_s ** 2 + (nbytes * seg.beta_se_s_per_B) ** 2
               + 2 * nbytes * rho * seg.alpha_se_s * seg.beta_se_s_per_B)
        half = _z(level) * math.sqrt(max(var, 0.0)) * p.rank_scale
        return max(p.time_s - half, 0.0), p.time_s + half

    def alpha_beta(self, backend: str, op: str, nbytes: float, scope: Scope = "any",
                   ranks: int | None = None) -> tuple[float, float]:
        """(α s, β s/B) of the segment covering ``nbytes``, as measured (no rank scaling).

        Without ``ranks`` the entry with the most ranks is used.
        """
        _check_query(nbytes, ranks or 1)
        _, seg = self._entry(backend, op, ranks, scope).segment(nbytes)
        return seg.alpha_s, seg.beta_s_per_B

    def best_backend(self, op: str, nbytes: float, ranks: int,
                     scope: Scope = "any") -> tuple[str, float]:
        """Fastest calibrated backend for this operation and size (MCR-DL-style mix and
        match); ties go to the alphabetically first backend."""
        times = []
        for b in self.backends:
            try:
                times.append((self.time_s(b, op, nbytes, ranks, scope), b))
            except CalibrationLookupError:
                continue
        if not times:
            raise CalibrationLookupError(f"no backend in this profile has {op!r} at scope "
                                         f"{scope!r}")
        t, b = min(times)
        return b, t

    # -------------------------------------------------------------------------- compute
    @property
    def has_compute(self) -> bool:
        """Whether the profile holds compute-efficiency fits."""
        return bool(self.doc.compute)

    def _compute(self, dtype: str, backend: str | None, device: str | None,
                 kind: str) -> ComputeEntry:
        found = [c for c in self.doc.compute if c.dtype == dtype and c.kind == kind
                 and backend in (None, c.backend) and device in (None, c.device)]
        if not found:
            have = sorted({(c.backend, c.device, c.kind, c.dtype) for c in self.doc.compute})
            raise CalibrationLookupError(f"no compute calibration for dtype={dtype!r} kind={kind!r}"
                                   f"{f' backend={backend!r}' if backend else ''}"
                                   f"{f' device={device!r}' if device else ''}; the profile has "
                                   f"{', '.join(map(str, have)) or 'none'}")
        return max(found, key=lambda c: (c.device != "cpu", c.backend))

    def compute_rate_flops_per_s(self, flops: float, dtype: str, *, backend: str | None = None,
                                 device: str | None = None, kind: str = "gemm") -> float:
        """Achieved FLOP/s for one call of ``flops`` FLOPs."""
        if not flops > 0:
            raise ConfigError(f"flops must be > 0, got {flops!r}")
        c = self._compute(dtype, backend, device, kind)
        return c.rate_max_flops_per_s * flops / (flops + c.x_half_flops)

    def compute_efficiency(self, flops: float, dtype: str, *, backend: str | None = None,
                           device: str | None = None, kind: str = "gemm",
                           shape: tuple[float, float, float] | None = None,
                           batch: float = 1) -> float:
        """η = achieved / peak FLOP/s for one call of ``flops`` FLOPs (needs the peak); a
        GEMM ``shape`` (M, N, K) × ``batch`` the fit measured itself takes its measured
        time (``flops / seconds``), any other the fitted curve."""
        c = self._compute(dtype, backend, device, kind)
        seconds = c.shape_seconds(shape, batch) if shape is not None else None
        if seconds is not None and c.peak_flops_per_s is not None:
            return flops / seconds / c.peak_flops_per_s
        if c.peak_flops_per_s is None:  # a prediction cannot use it: say so, once per fit
            msg = (f"the {c.backend}/{c.device} {kind} {dtype} compute fit has no peak FLOP/s, "
                   "so no efficiency: predictions keep the device model's times; refit with "
                   "--peak or --system, or use compute_rate_flops_per_s")
            if (c.backend, c.device, kind, dtype) not in self._warned:
                self._warned.add((c.backend, c.device, kind, dtype))
                warnings.warn(msg, DDLSimWarning, stacklevel=2)
            raise CalibrationError(msg)
        return self.compute_rate_flops_per_s(flops, dtype, backend=c.backend, device=c.device,
                                             kind=kind) / c.peak_flops_per_s


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _round(x: object) -> object:
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def _check_query(nbytes: float, ranks: int) -> None:
    """Numbers of any numeric type (numpy included); bools are rejected."""
    if isinstance(nbytes, bool) or not (isinstance(nbytes, numbers.Real) and nbytes >= 0
                                        and math.isfinite(nbytes)):
        raise ConfigError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, numbers.Integral) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1, got {ranks!r}")


def list_default_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped in ``ddlsim/data/calibration`` (one per system preset)."""
    root = resources.files("ddlsim.data").joinpath("calibration")
    return tuple(sorted(p.name.removesuffix(".yaml") for p in root.iterdir()
                        if p.name.endswith(".yaml")))


def load_default_profile(system: str) -> CalibrationProfile:
    """The shipped profile of a system preset (e.g. ``dgx-a100``)."""
    names = list_default_profiles()
    if system not in names:
        raise ConfigError(f"no shipped calibration profile {system!r}; shipped: "
                          f"{', '.join(names)}")
    text = resources.files("ddlsim.data").joinpath("calibration", f"{system}.yaml").read_text()
    return CalibrationProfile.from_dict(yaml.safe_load(text), where=f"{system}.yaml")
