"""Former home of the GPT builder, now the decoder family (:mod:`ddlsim.workloads.decoder`);
kept so that ``megatron_groups`` and ``build_gpt_workload`` imports still work."""

from __future__ import annotations

import numpy as np

from .decoder.builder import ADAM_BYTES_PER_PARAM
from .trace import GroupFamily

__all__ = ["build_gpt_workload", "megatron_groups", "gpt_memory", "ADAM_BYTES_PER_PARAM"]


def megatron_groups(tp: int, dp: int, pp: int) -> dict[str, GroupFamily]:
    """tp, dp and pp group families for ``rank = t + T·(d + D·s)``, written out directly: the
    reference that :meth:`DeviceMesh.from_megatron`'s families (which the builders use) are
    tested against."""
    r = np.arange(tp * dp * pp).reshape(pp, dp, tp)  # [s, d, t]
    return {
        "tp": GroupFamily("tp", "tp", r.reshape(pp * dp, tp)),
        "dp": GroupFamily("dp", "dp", r.transpose(0, 2, 1).reshape(pp * tp, dp)),
        "pp": GroupFamily("pp", "pp", r.transpose(1, 2, 0).reshape(dp * tp, pp)),
    }


def build_gpt_workload(cfg):
    """The trace of one training iteration of ``cfg`` (any decoder family)."""
    return cfg.family.build(cfg)


def gpt_memory(cfg) -> list:
    """Per-stage memory of one rank."""
    return cfg.family.memory(cfg)
