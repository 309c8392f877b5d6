"""Model-section fields of the decoder family that select the *program* a rank runs per
iteration: Megatron-LM's (the default) or one of the ``spcl/DNN-cpp-proxies`` GPT proxies',
with the proxies' departures from Megatron as explicit options (docs/workloads/gpt_proxies.md).

* ``program``: ``megatron`` (today's builder), ``proxy_gpipe`` (gpt2_large.cpp, gpt3.cpp,
  gpt3_moe.cpp: every forward micro-batch, then every backward, then the gradient
  all-reduces) or ``proxy_one_step`` (gpt3_one_pipe_step.cpp, gpt3_moe_one_pipe_step.cpp: one
  pipeline step, even stages forward, odd stages backward).
* ``compute``: ``model`` (the cost model; with a proxy program, each layer's GEMM FLOPs) or
  ``proxy`` (``proxy_timings``: the proxy's ``usleep`` constants per layer and micro-batch;
  proxy programs only).
* ``pipeline_p2p``: ``dependent`` (a stage sends micro-batch i after computing it, which it
  does after receiving it) or ``concurrent`` (comm_only proxies: the send to the next stage
  and the receive from the previous one are posted together and waited for together).
* ``grad_sync``: ``bucketed`` (DDP buckets; Megatron), ``per_layer`` (one blocking
  all-reduce per layer after the backward, the embedding merged into the first layer's and
  the head and final norm into the last's: gpt2_large.cpp ``MSGAGG``) or ``per_stage`` (one
  all-reduce of the stage's gradients: gpt3.cpp, gpt3_moe.cpp).
* ``grad_buffers``: ``all`` (every parameter) or ``layer_weights`` (only the transformer
  layers' weight matrices: no biases, norms, router, embedding or head, as gpt3.cpp's
  ``DP_ALLREDUCE_SIZE = 12h²/4``).
* ``recv_buffers``: ``reused`` or ``fresh`` (comm_only/gpt2_large.cpp:63-64 ``calloc`` a new
  receive buffer every iteration: its first receive faults the pages in,
  :mod:`ddlsim.workloads.freshbuffers`); ``proxy_gpipe`` only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...config import ModelBase, Seconds
from ..freshbuffers import RECV_BUFFERS_FIELD, RecvBuffers
from ..proxytime import check_proxy_timings

__all__ = ["ProgramFields", "required_timings"]


def required_timings(moe: bool) -> tuple[str, ...]:
    """The ``proxy_timings`` keys a proxy program needs: per layer and micro-batch, the
    forward and backward sleep, and for an MoE model the experts' sleep after each."""
    base = ("forward", "backward")
    return base + (("forward_experts", "backward_experts") if moe else ())


class ProgramFields(ModelBase):
    """Which program the ranks run, and the GPT proxies' departures from Megatron-LM."""

    program: Literal["megatron", "proxy_gpipe", "proxy_one_step"] = Field(
        default="megatron", description="the per-iteration program: Megatron-LM's, or a "
        "DNN-cpp-proxies GPT proxy's (docs/workloads/gpt_proxies.md)")
    compute: Literal["model", "proxy"] = Field(
        default="model", description="compute times from the cost model, or the proxy's "
        "usleep constants in proxy_timings")
    proxy_timings: dict[str, Seconds] | None = Field(
        default=None, description="compute: proxy: usleep per layer and micro-batch "
        "(forward, backward; MoE: forward_experts, backward_experts)")
    pipeline_p2p: Literal["dependent", "concurrent"] = "dependent"
    grad_sync: Literal["bucketed", "per_layer", "per_stage"] = "bucketed"
    grad_buffers: Literal["all", "layer_weights"] = "all"
    recv_buffers: RecvBuffers = RECV_BUFFERS_FIELD

    @model_validator(mode="after")
    def _check_program(self) -> "ProgramFields":
        proxy = self.program != "megatron"
        if self.compute == "model" and self.proxy_timings is not None:
            raise ValueError("model.proxy_timings is given but model.compute is 'model' (the "
                             "cost model): set compute: proxy to use the timings, or remove them")
        if self.compute == "proxy" and not proxy:
            raise ValueError("model.compute = 'proxy' with model.program = 'megatron': the "
                             "proxies' sleeps are per layer, Megatron's program times each "
                             "operator; set program to proxy_gpipe or proxy_one_step, or use "
                             "compute: model")
        departures = {n: getattr(self, n) for n, d in (("pipeline_p2p", "dependent"),
                      ("grad_sync", "bucketed"), ("grad_buffers", "all")) if getattr(self, n) != d}
        if not proxy and departures:
            raise ValueError(f"model fields {departures} are options of the proxy programs; "
                             "set model.program to proxy_gpipe or proxy_one_step, or remove them")
        if self.program == "proxy_gpipe" and self.grad_sync == "bucketed":
            raise ValueError("model.program = 'proxy_gpipe' needs model.grad_sync = 'per_layer' "
                             "or 'per_stage' (the proxies all-reduce after the backward, not in "
                             "DDP buckets)")
        if self.program == "proxy_one_step" and self.grad_sync != "bucketed":
            raise ValueError(f"model.grad_sync = {self.grad_sync!r} with program "
                             "'proxy_one_step': one pipeline step has no gradient "
                             "synchronisation; remove grad_sync")
        if self.recv_buffers == "fresh" and self.program != "proxy_gpipe":
            raise ValueError(f"model.recv_buffers = 'fresh' with program {self.program!r}: "
                             "only the comm_only GPipe proxy (program: proxy_gpipe) allocates "
                             "its receive buffer every iteration; remove recv_buffers")
        if self.compute == "proxy":
            self._check_timings()
        return self

    def _check_timings(self) -> None:
        need = required_timings(bool(getattr(self, "num_local_experts", 0)))
        check_proxy_timings(self.compute, self.proxy_timings, need, self.architecture)
