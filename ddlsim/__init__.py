"""ddlsim: predict one training iteration of a distributed deep-learning job, and explain it."""

from .config import RunConfig, load_config
from .errors import ConfigError, DDLSimError, PlanDoesNotFitError

__version__ = "0.1.0"
__all__ = ["RunConfig", "load_config", "ConfigError", "DDLSimError", "PlanDoesNotFitError",
           "__version__"]
