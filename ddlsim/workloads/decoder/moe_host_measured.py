"""The host seconds per call of a Megatron-Core MoE layer's parts, measured in Megatron-LM's own
code (docs/moe.md, "Host seconds, measured").

**Measured host seconds** (:func:`measured_host`, ddlsim/data/moe_host_measured.yaml, written by
benchmarks/moe_host_ops.py): Megatron-LM's own ``MoELayer`` run on CPU, each part's thread CPU
time per pass less the time inside ``torch.distributed`` calls (gloo's transport; on a GPU
NCCL launches, which ddlsim's collectives carry) and less the CPU kernels' own execution: the
host's glue (Python, argument handling, autograd plumbing, the dispatcher), which the per-op
rule's ``eager_op_s`` (2 µs) stands for. ddlsim charges it per counted call: each part's
seconds over its measured calls (unfused router and permutation: the per-call glue is taken to
hold for the fused paths' fewer calls) times the calls :data:`.moe_host.DISPATCHER_HOST`
counts, as the op's ``host_s`` with no kernel, so no launch is charged twice (the device ops
carry their kernels' launches). The backward's (``bwd.moe.host``): its autograd nodes' time
per forward call of the part, the same way. This CPU (a KVM guest of an AMD EPYC, Zen 4) is
taken to run a thread as fast as the validated runs' hosts (DGX H100: Xeon Platinum 8480C):
no published single-thread comparison was found, ratio 1, not scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MEASURED_CODE", "MeasuredHost", "measured_host"]

#: the Megatron-LM code whose measured host seconds ddlsim charges
#: (ddlsim/data/moe_host_measured.yaml): d7288711, the commit DISPATCHER_HOST was counted at
#: and Megatron-Bridge v0.4.0 pins. The plan names no code revision, so the ModelZoo rows'
#: 1e057005 (measured too) is not selected.
MEASURED_CODE = "d7288711"


@dataclass(frozen=True)
class MeasuredHost:
    """Measured host seconds per counted forward call of each part of a Megatron-Core MoE
    layer (``fwd``: the forward's, ``bwd``: its autograd nodes' backward, per forward call of
    the part), from ddlsim/data/moe_host_measured.yaml (:func:`measured_host`); ``code`` the
    Megatron-LM commit measured."""

    code: str
    fwd: dict
    bwd: dict

    def forward_seconds(self, parts: tuple[tuple[str, int], ...]) -> tuple[float, int]:
        """The measured seconds of ``parts``' calls and the count of the calls of parts without
        a figure (left to the host rule)."""
        return (sum(n * self.fwd[p] for p, n in parts if p in self.fwd),
                sum(n for p, n in parts if p not in self.fwd))


@lru_cache(maxsize=None)
def measured_host(code: str = MEASURED_CODE) -> MeasuredHost:
    """The measured host seconds per call of Megatron-LM ``code``'s MoE layer parts: each
    part's host seconds over its measured forward calls, pooled over the measured local
    expert counts (ddlsim/data/moe_host_measured.yaml, benchmarks/moe_host_ops.py).

    Parameters
    ----------
    code : str
        a Megatron-LM commit the data file has (``d7288711``, ``1e057005``).

    Returns
    -------
    MeasuredHost

    Raises
    ------
    ValueError
        for a commit the file does not have.
    """
    from importlib import resources

    import yaml
    data = yaml.safe_load(resources.files("ddlsim.data").joinpath(
        "moe_host_measured.yaml").read_text())["code"]
    if code not in data:
        raise ValueError(f"moe_host_measured.yaml has no Megatron-LM code {code!r}; it has "
                         f"{sorted(data)}")
    runs = data[code]["local_experts"].values()
    per_call = {}
    for pss in ("fwd", "bwd"):
        per_call[pss] = {
            part: sum(r["host_s"][pss][part] for r in runs) / sum(r["calls"][part] for r in runs)
            for part in next(iter(runs))["calls"]}
    return MeasuredHost(code, per_call["fwd"], per_call["bwd"])
