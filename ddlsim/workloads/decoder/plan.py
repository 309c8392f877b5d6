"""The resolved plan of one decoder run: what the stage builder needs, computed once.

:func:`resolve_plan` reads the run config once and hands
:class:`~ddlsim.workloads.decoder.builder.StageBuilder` a :class:`DecoderPlan`: the parallel
dimensions, the batch, the dtypes, the layer split, the data-parallel update, recomputation,
the stack's resolved features, the MoE options, the schedule, the device and the layer
partitioner. The builder and its mixins (:mod:`.dpsync`, :mod:`.moe`, :mod:`.edges`), the
layer partitioners (:mod:`.partition`) and the memory model (:mod:`.memory`) read the plan and
nothing else of the config; every rule that turns config fields into a plan field is the one
its own module states (:func:`.split.chunk_layers`, :func:`.hsdp.shard_group`,
:func:`.moeplan.resolve_moe`, :func:`.dpsync.grad_bucket_bytes`,
:func:`.layerkernels.activation_kinds`, :func:`.combined.active`, …), called here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping

from ...config import DTYPE_BYTES
from ..payloads import _quick_init
from . import combined, param_gather, tp_overlap
from .dpsync import grad_bucket_bytes
from .hsdp import shard_group
from .layerkernels import activation_kinds, compute_dtype, grad_bytes
from .moeplan import MoEPlan, resolve_moe
from .overlap import p2p_overlapped
from .partition import LayerPartitioner, make_partitioner
from .split import chunk_layers

__all__ = ["DecoderPlan", "resolve_plan"]


@_quick_init
@dataclass(frozen=True, eq=False)
class DecoderPlan:
    """One decoder run as the stage builder needs it, every field resolved.

    Parallel sizes are rank counts; ``micro_batch`` is sequences, ``seq_length`` tokens;
    byte sizes are bytes. Plans compare by identity (the partitioner is an object).
    The layer partitioner (:attr:`partitioner`) is built from the plan on first use.
    """

    #: the model's closed-form counts (:class:`~ddlsim.workloads.models.decoder.DecoderShape`)
    shape: Any
    #: ranks of the tensor-parallel grid (the ``tp`` mesh axis, any scheme)
    tp: int
    #: the tensor-parallel scheme, a key of the layer-partitioner registry
    #: (``parallel.tp_mode``: ``1d`` unless ``tensor_parallel`` says)
    tp_mode: str
    #: its grid (``parallel.tensor_parallel``: ``mode``, ``size``, ``q``, ``d``); None when
    #: only ``tensor_model_parallel_size`` is given (1-D)
    tensor_parallel: Any
    #: pipeline stages
    pp: int
    #: model chunks per stage (virtual stages; 1 without interleaving)
    vpp: int
    #: data-parallel ranks (``data_parallel_size``)
    dp: int
    #: context-parallel ranks
    cp: int
    #: how the attention core reaches the other cp ranks' keys and values
    #: (``parallel.cp_comm_type``, else the stack's: ``p2p``, a ring, or ``all_gather``)
    cp_comm: str
    #: expert-parallel ranks
    ep: int
    #: expert tensor-parallel ranks
    etp: int
    #: ranks of the expert data-parallel group, over which expert gradients sync
    edp: int
    #: Megatron's sequence parallelism (activations split over TP between the GEMMs)
    sp: bool
    #: sequences per micro-batch
    micro_batch: int
    #: tokens per sequence
    seq_length: int
    #: ``train.dtype`` as given (``fp8`` runs the linear GEMMs in FP8)
    train_dtype: str
    #: dtype of everything but the linear GEMMs (bf16 under FP8, :func:`.compute_dtype`)
    dtype: str
    #: bytes per element of ``dtype``
    dtype_bytes: int
    #: bytes per gradient element in the gradient buffers and their reduction (the stack's
    #: ``grad_reduce_dtype``: fp32 main grads with bf16 in Megatron, :func:`.grad_bytes`)
    grad_dtype_bytes: int
    #: keywords of :meth:`~ddlsim.workloads.models.decoder.DecoderShape.layer_activation_bytes`
    #: the stack and dtype set (``flash``, ``fp8``: :func:`.layerkernels.activation_kinds`)
    activation_kinds: Mapping[str, bool]
    #: transformer layers of each model chunk, ``split[stage][chunk]`` (:mod:`.split`)
    split: tuple[tuple[int, ...], ...]
    #: ``parallel.schedule`` (``gpipe``, ``1f1b``, ``interleaved``)
    schedule: str
    #: micro-batches per iteration and pipeline (``num_microbatches``)
    microbatches: int
    #: the interleaved schedule's micro-batches per group (``RunConfig.microbatch_group``)
    microbatch_group: int
    #: whether Megatron-Core's combined 1F1B runs (:func:`.combined.active`)
    combined_1f1b: bool
    #: ``parallel.dp_strategy`` (``ddp``, ``reduce_broadcast``, …)
    dp_strategy: str
    #: ZeRO stage, 0 to 3
    zero_stage: int
    #: the gradient group's family: ``dp``, ``dp_cp`` under CP, ``dp_shard`` under HSDP
    grad_group: str
    #: ranks of the gradient group (:func:`.hsdp.shard_group`)
    grad_group_size: int
    #: FSDP replicas under HSDP (``data_parallel_replicate_size``; 1 without)
    hsdp_replicas: int
    #: bytes of one gradient bucket: of the first chunk of the first stage, and of every other
    #: chunk (:func:`.dpsync.grad_bucket_bytes`; ``inf``: one bucket)
    grad_buckets: tuple[float, float]
    #: whether the parameter all-gather overlaps the next forward (:func:`.param_gather.active`)
    param_gather_overlap: bool
    #: bytes of the parameter gather's first bucket, 16-bit parameters (:mod:`.param_gather`)
    param_bucket_bytes: float
    #: ``train.optimizer``
    optimizer: str
    #: ``train.recompute``: ``none``, ``selective`` or ``full``
    recompute: str
    #: ``train.recompute_every_n_layers`` (1: every layer alike)
    recompute_every_n_layers: int
    #: ``train.recompute_modules``: Megatron-Core's selectively recomputed modules
    #: (:mod:`.recompute_modules`); None: the stack's ``selective_recompute``
    recompute_modules: tuple[str, ...] | None
    #: the same run without recomputation, for the layers ``recompute_every_n_layers`` leaves
    #: un-checkpointed (:mod:`.sac`); None when every layer is checkpointed alike
    uncheckpointed: DecoderPlan | None
    #: the resolved software stack (:class:`~ddlsim.software.Software`)
    software: Any
    #: how TP collectives overlap their GEMMs (:func:`.tp_overlap.mode`); None: blocking
    tp_overlap: str | None
    #: whether pipeline sends and receives overlap compute (:func:`.overlap.p2p_overlapped`)
    p2p_overlap: bool
    #: the resolved MoE options (:func:`.moeplan.resolve_moe`); None for a dense model
    moe: MoEPlan | None
    #: the system's device (``system.device``: memory capacity in bytes, the CUDA context)
    device: Any

    @cached_property
    def partitioner(self) -> LayerPartitioner:
        """The tensor-parallel scheme of the layers (:func:`.partition.make_partitioner` of
        this plan), built once, on first use."""
        return make_partitioner(self)

    def bucket_bytes(self, stage: int = 0, chunk: int = 0) -> float:
        """Bytes of one gradient bucket of model chunk ``chunk`` on pipeline ``stage``.

        Parameters
        ----------
        stage : int
            Pipeline stage, from 0.
        chunk : int
            Model chunk (virtual stage) of that stage, from 0.

        Returns
        -------
        float
            Bytes (``inf``: the chunk's gradients are one bucket).
        """
        return self.grad_buckets[0] if stage == 0 and chunk == 0 else self.grad_buckets[1]


def resolve_plan(cfg: Any, shape: Any) -> DecoderPlan:
    """The plan of run ``cfg`` for a decoder of ``shape``, every field resolved once.

    Parameters
    ----------
    cfg : RunConfig
        The validated run.
    shape : DecoderShape
        Its model's closed-form counts (``cfg.model.shape()``).

    Returns
    -------
    DecoderPlan
        What the stage builder, the layer partitioner and the memory model read.

    Raises
    ------
    ValueError
        When the pipeline split is impossible (:func:`.split.chunk_layers`).
    ConfigError
        When an MoE option is unset and the stack does not say it
        (:func:`.moeplan.resolve_moe`).
    """
    p, t, sw = cfg.parallel, cfg.train, cfg.software
    dtype, gdt = compute_dtype(t.dtype), grad_bytes(cfg)
    group, gdp = shard_group(cfg)
    uncheckpointed = None
    if t.recompute_every_n_layers > 1:
        plain = t.model_copy(update={"recompute": "none", "recompute_every_n_layers": 1})
        uncheckpointed = resolve_plan(cfg.model_copy(update={"train": plain}), shape)
    return DecoderPlan(
        shape=shape, tp=p.tp, tp_mode=p.tp_mode, tensor_parallel=p.tensor_parallel,
        pp=p.pp, vpp=p.vpp, dp=cfg.dp, cp=p.cp, cp_comm=sw.cp_comm_type, ep=p.ep, etp=p.etp,
        edp=cfg.mesh.size("edp"), sp=p.sequence_parallel, micro_batch=t.micro_batch_size,
        seq_length=t.seq_length, train_dtype=t.dtype, dtype=dtype,
        dtype_bytes=DTYPE_BYTES[dtype], grad_dtype_bytes=gdt,
        activation_kinds=MappingProxyType(activation_kinds(cfg, shape=shape)), split=_split(cfg),
        schedule=p.schedule, microbatches=cfg.num_microbatches,
        microbatch_group=cfg.microbatch_group,
        combined_1f1b=combined.active(cfg),
        dp_strategy=p.dp_strategy, zero_stage=p.zero_stage, grad_group=group,
        grad_group_size=gdp, hsdp_replicas=p.data_parallel_replicate_size,
        grad_buckets=(float(grad_bucket_bytes(cfg, cfg.dp, gdt, 0, 0)),
                      float(grad_bucket_bytes(cfg, cfg.dp, gdt, 1, 0))),
        param_gather_overlap=param_gather.active(cfg),
        # the gather's buckets in its dtype: FP8 parameters at one byte (.param_gather)
        param_bucket_bytes=float(grad_bucket_bytes(
            cfg, cfg.dp, param_gather.gather_bytes_per_param(sw, t.dtype, 2))),
        optimizer=t.optimizer, recompute=t.recompute,
        recompute_every_n_layers=t.recompute_every_n_layers, uncheckpointed=uncheckpointed,
        recompute_modules=_recompute_modules(cfg, shape, sw),
        software=sw, tp_overlap=tp_overlap.mode(cfg), p2p_overlap=p2p_overlapped(cfg),
        moe=resolve_moe(cfg) if shape.is_moe else None, device=cfg.system.device)


def _split(cfg: Any) -> tuple:
    """:func:`.split.chunk_layers`; a chunk without a layer (the embedding's or the loss's
    alone) is not modelled under Megatron-Core's combined 1F1B, which pairs layers."""
    split = chunk_layers(cfg)
    if min(map(min, split)) == 0 and combined.active(cfg):
        from ...errors import ConfigError
        raise ConfigError("parallel.moe.overlap_expert_parallel_comm = true with a pipeline "
                          "chunk that holds no transformer layer (account_for_embedding/loss_"
                          f"in_pipeline_split; layers per chunk {[list(r) for r in split]}): "
                          "the combined 1F1B of such a chunk is not modelled; use more layers "
                          "per chunk (fewer pipeline or virtual stages) or the overlap off")
    return split


def _recompute_modules(cfg: Any, shape: Any, sw: Any) -> tuple | None:
    """``train.recompute_modules``, checked against the model and plan
    (:func:`.recompute_checks.check_modules`); None when unset."""
    if cfg.train.recompute_modules is None:
        return None
    from ...errors import ConfigError
    from .recompute_checks import check_modules
    mods, p = tuple(cfg.train.recompute_modules), cfg.parallel
    if mods != ("core_attn",) and p.tp_mode != "1d":
        raise ConfigError(f"train.recompute_modules = {list(mods)!r} is modelled for "
                          "Megatron's 1-D tensor parallelism, with or without context "
                          f"parallelism (here tensor_parallel.mode {p.tp_mode!r}); use "
                          "['core_attn'], recompute 'full' or 'none', or tensor_parallel.mode "
                          "'1d'")
    check_modules(mods, shape, sw, resolve_moe(cfg) if shape.is_moe else None, p.cp)
    return mods

