"""ddlsim: predict one training iteration of a distributed deep-learning job, and explain it.

    >>> import ddlsim
    >>> cfg = ddlsim.load_config("examples/gpt3-175b-1024-a100.yaml")
    >>> result = ddlsim.predict(cfg)            # analytical engine
    >>> result.iteration_time_s, result.breakdown
"""

from .api import build_workload, memory_per_device, predict
from .config import RunConfig, load_config
from .errors import ConfigError, DDLSimError, DeadlockError, PlanDoesNotFitError

__version__ = "0.1.0"
__all__ = ["RunConfig", "load_config", "predict", "build_workload", "memory_per_device",
           "ConfigError", "DDLSimError", "DeadlockError", "PlanDoesNotFitError", "__version__"]
