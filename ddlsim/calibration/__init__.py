"""Calibration: benchmarks that run, readers of existing results, fitters, profiles.

Data flow: ``ddlsim calibrate comm``/``compute`` (or nccl-tests / OSU output) → a tidy table
(:mod:`.schema`) → :func:`build_profile` (piecewise α-β fits, :mod:`.fit`; compute efficiency,
:mod:`.efficiency`) → a versioned YAML :class:`CalibrationProfile` that the engines query.
"""

from .._lazy import lazy_exports

__all__ = ["CommAdapter", "MpiAdapter", "TorchAdapter", "OpCall", "run_comm_benchmark",
           "run_scoped_benchmarks", "default_sizes", "run_gemm_benchmark",
           "run_attention_benchmark", "fit_alpha_beta", "fit_efficiency", "AlphaBetaFit",
           "SegmentFit", "build_profile", "CalibrationProfile", "CommPrediction",
           "list_default_profiles", "load_default_profile", "read_results", "detect_format",
           "COLUMNS", "OPS", "CalibrationError", "CalibrationLookupError", "ResultParseError",
           "busbw_factor"]

_EXPORTS = {
    "CommAdapter": ".adapters",
    "MpiAdapter": ".adapters",
    "OpCall": ".adapters",
    "TorchAdapter": ".adapters",
    "build_profile": ".build",
    "default_sizes": ".comm_bench",
    "run_comm_benchmark": ".comm_bench",
    "run_scoped_benchmarks": ".comm_bench",
    "run_attention_benchmark": ".compute_bench",
    "run_gemm_benchmark": ".compute_bench",
    "fit_efficiency": ".efficiency",
    "AlphaBetaFit": ".fit",
    "SegmentFit": ".fit",
    "fit_alpha_beta": ".fit",
    "CalibrationProfile": ".profile",
    "CommPrediction": ".profile",
    "list_default_profiles": ".profile",
    "load_default_profile": ".profile",
    "detect_format": ".readers",
    "read_results": ".readers",
    "COLUMNS": ".schema",
    "OPS": ".schema",
    "CalibrationError": ".schema",
    "CalibrationLookupError": ".schema",
    "ResultParseError": ".schema",
    "busbw_factor": ".schema",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
