"""ddlsim: predict one training iteration of a distributed deep-learning job, and explain it.

    >>> import ddlsim
    >>> cfg = ddlsim.load_config("examples/gpt3-175b-1024-a100.yaml")
    >>> result = ddlsim.predict(cfg)            # analytical engine
    >>> result.iteration_time_s, result.breakdown
    >>> ddlsim.results_frame([result])          # a pandas DataFrame, one row per result
    >>> ddlsim.search("examples/search-gpt3-175b-1024.yaml")   # ranked plans, a DataFrame

Names are imported on first use (PEP 562), so ``import ddlsim`` and the CLI start fast.
"""

from ._lazy import lazy_exports
from ._version import __version__
from .errors import ConfigError, DDLSimError, DeadlockError, PlanDoesNotFitError

_EXPORTS = {
    "RunConfig": ".config", "load_config": ".config",
    "predict": ".api", "build_workload": ".api", "memory_per_device": ".api",
    "check_memory": ".api", "memory_alternatives": ".api",
    "Result": ".simulator.result", "results_frame": ".simulator.result", "sweep": ".sweeps",
}

__all__ = [*_EXPORTS, "search", "ConfigError", "DDLSimError", "DeadlockError", "PlanDoesNotFitError",
           "__version__"]

_lazy = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str) -> object:
    if name == "search":  # the subpackage, callable: ddlsim.search(...) → a DataFrame
        import importlib
        return importlib.import_module(".search", __name__)
    return _lazy(name)


def __dir__() -> list[str]:
    return sorted(__all__)
