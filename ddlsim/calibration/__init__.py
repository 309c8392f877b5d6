"""Calibration: benchmarks that run, readers of existing results, fitters, profiles.

Data flow: ``ddlsim calibrate comm``/``compute`` (or nccl-tests / OSU output) → a tidy table
(:mod:`.schema`) → :func:`build_profile` (piecewise α-β fits, :mod:`.fit`; compute efficiency,
:mod:`.efficiency`) → a versioned YAML :class:`CalibrationProfile` that the engines query.
"""

from .adapters import CommAdapter, MpiAdapter, OpCall, TorchAdapter
from .build import build_profile
from .comm_bench import default_sizes, run_comm_benchmark, run_scoped_benchmarks
from .compute_bench import run_attention_benchmark, run_gemm_benchmark
from .efficiency import fit_efficiency
from .fit import AlphaBetaFit, SegmentFit, fit_alpha_beta
from .profile import (CalibrationProfile, CommPrediction, list_default_profiles,
                      load_default_profile)
from .readers import detect_format, read_results
from .schema import (COLUMNS, OPS, CalibrationError, CalibrationLookupError, ResultParseError,
                     busbw_factor)

__all__ = ["CommAdapter", "MpiAdapter", "TorchAdapter", "OpCall", "run_comm_benchmark",
           "run_scoped_benchmarks", "default_sizes", "run_gemm_benchmark",
           "run_attention_benchmark", "fit_alpha_beta", "fit_efficiency", "AlphaBetaFit",
           "SegmentFit", "build_profile", "CalibrationProfile", "CommPrediction",
           "list_default_profiles", "load_default_profile", "read_results", "detect_format",
           "COLUMNS", "OPS", "CalibrationError", "CalibrationLookupError", "ResultParseError",
           "busbw_factor"]
