"""``overlap_param_gather``: the distributed optimizer's parameter all-gather (ZeRO-1/2)
hidden behind the next forward, as Megatron-Core's DDP buckets run it.

Megatron-Core (``distributed/param_and_grad_buffer.py``, ``--overlap-param-gather``, 2024)
gathers the updated parameters bucket by bucket, the same buckets as the gradients; the
forward pre-hook of a bucket's first module waits for that bucket and launches the next. Off,
the whole gather runs right after the optimizer step, before the next iteration.

The trace is one steady-state iteration: the previous step's gather is issued at the start of
this one. The first bucket (``grad_bucket_size`` bytes, at most the stage's parameters) stays
exposed in the update block, as the forward cannot start without it; the rest runs on the
``dp`` stream beside the first micro-batch's forward of model chunk 0 (its block ``F0.pg``
waits on ``dp`` after its compute and before it sends the activation on: the forward needs
every bucket before it ends, and the next stage needs the forward's output). It shares the
``dp`` stream, in issue order, with the gradient reduce-scatters that follow.

**Model chunks (the interleaved schedule).** Megatron-Core r0.8.0 (``baf94af3c6``,
``optimizer/distrib_optimizer.py``) keeps one all-gather handle per bucket across the model
chunks in chunk order (``_get_model_param_buffer_dp_views``, lines 1348-1376: "we want to
still first run all_gather and all_gather_handle.wait() for the first model chunk"), and a
module's forward pre-hook waits for its own bucket only, then dispatches the next
(``_finish_param_sync_helper``, lines 1454-1475); ``finish_param_sync`` per chunk is called by
the schedule only under ``--delay-param-gather`` (``training/training.py`` lines 1005-1009; off
by default, ``arguments.py`` line 1431). So chunk 0's first forward waits for chunk 0's buckets
alone, and the other chunks' gathers run, in order, beside the warm-up forwards that follow.
Here: the prologue gathers the chunk-0 share (less the first bucket) as above, issues the rest
after it on the ``dp`` stream (:func:`prologue_block`, ``later_bytes``), and the first forward of
the last chunk (block ``F<v-1>.pg``, :func:`waiting_block`) waits for it: every chunk's gather
has arrived by then, and the intermediate chunks' own waits are not traced (exact where the
gather falls further behind the forwards chunk by chunk, as on a stage whose per-chunk gather
outlasts its PP warm-up forwards of a chunk; otherwise those waits cost at most the last
chunk's share). The later chunks' gather takes NCCL's SMs beside those forwards, not charged.

**Expert parallelism.** Where the routed experts are laid out apart (EP > 1 or expert TP ≠
TP, :mod:`.moe_update`), Megatron-Core (d7288711, ``distributed/distributed_data_parallel.py``)
keeps their parameters in ``expert_parallel_buffers`` gathered over the expert data-parallel
group (lines 294-303), with the same bucket size in elements (lines 63-65) and a bucket chain of
their own (lines 237-247, per buffer). So each buffer's first bucket stays exposed in the update
block and the rest of each runs beside ``F0``: the dense buffer's over the gradient group on
``dp``, the experts' over ``edp`` on ``edp`` (:func:`prologue_block`'s ``expert_bytes``,
``expert_later``). The experts' first bucket is really dispatched by the first expert module's
pre-hook (``param_and_grad_buffer.py`` ``finish_param_sync``, lines 449-456), mid-way through the
first MoE layer; left in the update block here, it takes the same time on the compute stream a
layer earlier.

**FP8 parameters** (``software.kernels.fp8_param_gather``, Megatron's ``--fp8-param-gather``):
the linears' weights are Transformer Engine ``Float8Tensor`` objects, so the gather moves 1 byte per
element of them (:func:`gather_bytes_per_param`; the buckets hold as many elements, so their bytes
halve too) and the optimizer step quantizes the master shard
(:mod:`ddlsim.simulator.kernels.fp8_weights`). Megatron-LM d7288711's rules (:func:`check_fp8`):
``training/arguments.py`` lines 924-926, "--fp8-param-gather only supported with distributed
optimizer, torch fsdp2, megatron fsdp, or inference mode", and lines 885-890, FSDP2 turns it off
under Transformer Engine 2 ("will fallback to bf16 all_gather"); FP8 parameters are TE's
quantized tensors (``fp8_utils.py`` ``quantize_param_shard`` calls TE's
``cast_master_weights_to_fp8``), so the recipe is one of TE's.
"""

from __future__ import annotations

import numpy as np

from ..smcontention import beside
from ..trace import P2P, Block, Collective, Op, Wait

__all__ = ["active", "exposed_bytes", "first_bucket", "overlapped_bytes", "prologue_block",
           "waiting_block", "waiting_block_name", "BLOCK", "fp8_params", "gather_bytes_per_param",
           "gathered_bytes", "check_fp8", "edge_params", "stage_bytes",
           "fp8_param_step_delta_bytes"]

#: the first forward's block name with the gather beside it
BLOCK = "F0.pg"


def active(cfg) -> bool:
    """Whether the stack's or plan's ``overlap_param_gather`` applies: ZeRO-1/2 under DDP
    with a gradient group (DP × CP) or, for experts laid out apart, an expert data-parallel
    group of more than one rank."""
    p = cfg.parallel
    if not (cfg.software.overlap_param_gather and p.zero_stage in (1, 2)
            and p.dp_strategy == "ddp"):
        return False
    apart = p.ep > 1 or p.etp != p.tp   # the experts' own layout (.moe_update)
    return cfg.dp * p.cp > 1 or (apart and cfg.mesh.size("edp") > 1)


def fp8_params(sw, train_dtype: str) -> bool:
    """Whether the linears' weights are FP8 parameters (``fp8_param_gather`` in FP8 training;
    :func:`check_fp8` refuses it elsewhere)."""
    return bool(sw.fp8_param_gather) and train_dtype == "fp8"


def gather_bytes_per_param(sw, train_dtype: str, dtype_bytes: float) -> float:
    """Bytes per parameter the distributed optimizer's all-gather moves: the FP8 parameters'
    one byte (:data:`~ddlsim.simulator.kernels.fp8_weights.FP8_PARAM_BYTES`), else the
    parameters' ``dtype_bytes``."""
    if fp8_params(sw, train_dtype):
        from ...simulator.kernels.fp8_weights import FP8_PARAM_BYTES
        return FP8_PARAM_BYTES
    return float(dtype_bytes)


def gathered_bytes(sw, train_dtype: str, dtype_bytes: float, params, edge_params=0.0):
    """Bytes of the distributed optimizer's all-gather of a stage's ``params`` parameters, of
    which ``edge_params`` are the embedding's and the output head's: with FP8 parameters the
    layers' at one byte (:func:`gather_bytes_per_param`), the edges' at ``dtype_bytes`` (they
    are not Transformer Engine modules: Megatron-Core's ``VocabParallelEmbedding`` and the
    head's ``ColumnParallelLinear`` keep 16-bit weights, so their buffer is Megatron's 16-bit
    one); the layers' norms and biases (a few ``h`` of a layer's ~12 ``h²``) are counted at one
    byte too. Element-wise on arrays of plans (the search tier's).

    Parameters
    ----------
    sw : Software
        the resolved stack (``fp8_param_gather``).
    train_dtype : str
        ``train.dtype``.
    dtype_bytes : float
        bytes per 16-bit parameter (2).
    params, edge_params : float or numpy.ndarray
        parameters of the stage on one rank, and its embedding's and head's among them.

    Returns
    -------
    float or numpy.ndarray
        bytes.
    """
    per = gather_bytes_per_param(sw, train_dtype, dtype_bytes)
    return (params - edge_params) * per + edge_params * dtype_bytes


def check_fp8(cfg) -> None:
    """Refuse ``fp8_param_gather`` where Megatron cannot run it (module docstring).

    Raises
    ------
    ValueError
        naming the field, the value and what is allowed: outside ``train.dtype: fp8``, with a
        recipe that is not Transformer Engine's (``te_delayed``, ``te_current``), or without
        the distributed optimizer (``parallel.zero_stage`` 1 or 2 under
        ``dp_strategy: ddp``).
    """
    sw, p = cfg.software, cfg.parallel
    if not sw.fp8_param_gather:
        return
    field = "system.software.kernels.fp8_param_gather = true"
    if cfg.train.dtype != "fp8":
        raise ValueError(f"{field} needs train.dtype: fp8 (the weights are FP8 parameters); "
                         f"here train.dtype = {cfg.train.dtype!r}: set it to false")
    if sw.fp8_recipe not in ("te_delayed", "te_current"):
        raise ValueError(f"{field} needs a Transformer Engine recipe (fp8_recipe te_delayed or "
                         f"te_current: FP8 parameters are TE's Float8Tensors, Megatron-LM "
                         f"d7288711 fp8_utils.py quantize_param_shard); here fp8_recipe = "
                         f"{sw.fp8_recipe!r}")
    if p.dp_strategy != "ddp" or p.zero_stage not in (1, 2):
        raise ValueError(f"{field} needs the distributed optimizer (parallel.zero_stage 1 or 2 "
                         f"with dp_strategy ddp: Megatron-LM d7288711 arguments.py lines "
                         f"924-926, '--fp8-param-gather only supported with distributed "
                         f"optimizer, torch fsdp2, megatron fsdp'; FSDP2 falls back to a bf16 "
                         f"gather under TE 2, lines 885-890, and Megatron-FSDP's FP8 gather is "
                         f"not modelled); here zero_stage = {p.zero_stage}, dp_strategy = "
                         f"{p.dp_strategy!r}")


def exposed_bytes(cfg, param_bytes: float) -> float:
    """Bytes of the gather left after the optimizer step: all of them, or the first bucket
    (the gradient buckets' parameters in the gathered dtype, :func:`gather_bytes_per_param`:
    :func:`.dpsync.grad_bucket_bytes`)."""
    from .dpsync import grad_bucket_bytes
    per = gather_bytes_per_param(cfg.software, cfg.train.dtype, 2)
    return first_bucket(active(cfg), param_bytes, grad_bucket_bytes(cfg, cfg.dp, per))


def first_bucket(on, param_bytes, bucket_bytes):
    """Bytes of the gather left exposed: the first bucket where the overlap is ``on``, else
    all of them; element-wise on arrays of plans (the search tier's)."""
    if isinstance(on, (bool, np.bool_)):
        return min(param_bytes, float(bucket_bytes)) if on else param_bytes
    return np.where(on, np.minimum(param_bytes, np.asarray(bucket_bytes, dtype=float)),
                    param_bytes)


def overlapped_bytes(cfg, param_bytes: float) -> float:
    """Bytes gathered beside the first forward."""
    return param_bytes - exposed_bytes(cfg, param_bytes)


def _first_send(ops: list[Op]) -> int:
    """Index of the first send among ``ops`` (their count when none)."""
    sends = [i for i, o in enumerate(ops)
             if isinstance(o.payload, P2P) and o.payload.kind == "send"]
    return sends[0] if sends else len(ops)


def _with_contention(ops: list[Op], gathers: tuple[Collective, ...], dtype: str) -> list[Op]:
    """``ops`` with the contention op of their GEMMs before the first send beside the
    overlapped ``gathers`` (:func:`~ddlsim.workloads.smcontention.beside`) inserted there;
    unchanged where they first receive an activation (a later pipeline stage: the gather,
    issued at the block's start, runs while the stage waits for it, not beside its compute)."""
    at = _first_send(ops)
    if any(isinstance(o.payload, P2P) and o.payload.kind == "recv" for o in ops[:at]):
        return ops
    extra = beside("params.all_gather", ops[:at], gathers, dtype)
    if extra is None:
        return ops
    later = [Op(o.payload, o.stream, tuple(d + 1 if d >= at else d for d in o.deps), o.repeat)
             for o in ops[at:]]
    return [*ops[:at], extra, *later]


def prologue_block(first: Block, group: str, nbytes: float, dtype: str,
                   later_bytes: float = 0.0, expert_bytes: float = 0.0,
                   expert_later: float = 0.0) -> Block:
    """``first`` (the stage's ``F0`` block) with the overlapped gather of ``nbytes`` issued
    at its start on the ``dp`` stream and a wait for it after its compute, before it sends
    its activation on: the forward cannot finish its layers before their parameters arrive,
    so what it sends depends on the whole gather. On the first stage the compute before the
    wait runs beside the gather and pays NCCL's SMs (a contention op, in the GEMMs'
    ``dtype``). ``later_bytes`` (the other model chunks' parameters, interleaved schedule) is
    gathered after it on the ``dp`` stream, issued at the block's end and waited for by
    :func:`waiting_block` (module docstring).

    ``expert_bytes`` and ``expert_later``: the same for the routed experts' own buffer
    (experts laid out apart, :mod:`.moe_update`), gathered over ``edp`` on the ``edp``
    stream beside the dense gather: Megatron-Core keeps them in ``expert_parallel_buffers``
    with their own bucket chain (module docstring, "Expert parallelism")."""
    gathers = [(Collective("params.all_gather.overlapped", "all_gather", group, nbytes), "dp")]
    if expert_bytes > 0:
        gathers.append((Collective("params.expert.all_gather.overlapped", "all_gather", "edp",
                                   expert_bytes), "edp"))
    n = len(gathers)
    body = _with_contention(list(first.ops), tuple(c for c, _ in gathers), dtype)
    body = [Op(o.payload, o.stream, tuple(d + n for d in o.deps), o.repeat) for o in body]
    at = _first_send(body)                          # the waits go before the first send
    waits = tuple(range(at + n, at + 2 * n))        # their indices once the gathers lead

    def shifted(o: Op) -> Op:
        deps = tuple(d + n if d >= at + n else d for d in o.deps)
        if isinstance(o.payload, P2P) and o.payload.kind == "send":
            deps += waits
        return Op(o.payload, o.stream, deps, o.repeat)

    ops = [Op(c, stream) for c, stream in gathers]
    ops += [*body[:at], *(Op(Wait(_wait_name(s, "wait"), s)) for _, s in gathers),
            *(shifted(o) for o in body[at:])]
    if later_bytes > 0:
        ops.append(Op(Collective("params.all_gather.later_chunks", "all_gather", group,
                                 later_bytes), "dp"))
    if expert_later > 0:
        ops.append(Op(Collective("params.expert.all_gather.later_chunks", "all_gather", "edp",
                                 expert_later), "edp"))
    return Block(BLOCK, first.phase, tuple(ops))


def waiting_block_name(chunk: int) -> str:
    """The name of model chunk ``chunk``'s first forward that waits for the later chunks'
    gather (:func:`waiting_block`)."""
    return f"F{chunk}.pg"


def waiting_block(block: Block, streams: tuple[str, ...] = ("dp",)) -> Block:
    """``block`` (the last model chunk's forward) with a wait for each of ``streams`` (the
    ``dp`` stream, and ``edp`` where the experts' later chunks are gathered there) before
    its ops: its first micro-batch cannot start its layers before the later chunks' gather
    (:func:`prologue_block`'s ``later_bytes``, issued first on that stream in the warm-up)
    has arrived."""
    k = len(streams)
    body = [Op(o.payload, o.stream, tuple(d + k for d in o.deps), o.repeat) for o in block.ops]
    name = waiting_block_name(int(block.name[1:]))
    return Block(name, block.phase, (*(Op(Wait(_wait_name(s, "later_wait"), s))
                                       for s in streams), *body))


def _wait_name(stream: str, what: str) -> str:
    """The name of a wait for the gather on ``stream`` (``edp``: the experts' buffer)."""
    return f"params.{'expert.' if stream == 'edp' else ''}gather.{what}"


def edge_params(b, stage: int, first: bool = True, last: bool = True) -> float:
    """Parameters of ``stage``'s embedding (``first``) and output head (``last``) on one rank
    of builder ``b`` (:func:`.builder.with_edges` of no layers): 16-bit under FP8 parameters
    too (:func:`gathered_bytes`)."""
    from .builder import with_edges
    return with_edges(b.shape, b.part.param_split, 0.0, first and stage == 0,
                      last and stage == b.pp - 1, b.pp)


def stage_bytes(b, stage: int, params: float | None = None, first: bool = True,
                last: bool = True) -> float:
    """Bytes of the distributed optimizer's gather of ``params`` parameters of ``stage``
    (default: the stage's, :meth:`.builder.StageBuilder.stage_params`) on builder ``b``,
    holding the embedding and head where ``first``/``last`` say (:func:`gathered_bytes`)."""
    params = b.stage_params(stage) if params is None else params
    return gathered_bytes(b.sw, b.plan.train_dtype, b.dt, params,
                          edge_params(b, stage, first, last))


def fp8_param_step_delta_bytes(sw, train_dtype: str, n_params: float,
                               dtype_bytes: float = 2.0) -> float:
    """Bytes the optimizer step moves over ``n_params`` master parameters (the rank's shard)
    with FP8 parameters beyond what it moves without: the master shard's cast into them
    (:func:`~ddlsim.simulator.kernels.fp8_weights.fp8_param_update_kernels`) replaces the
    copy into the 16-bit weights (read 4 + write ``dtype_bytes``,
    :func:`~ddlsim.simulator.kernels.step_passes.optimizer_bytes_per_param`'s step 5:
    Megatron-LM d7288711 ``distrib_optimizer.py`` lines 2462-2485, "FP8 params are quantized
    in the above quantize_param_shard function", the copy skipped for them). Delayed scaling:
    5 - 6 = -1 byte per parameter; current scaling: 9 - 6 = +3. 0 without FP8 parameters.
    The shard's embedding and head, 16-bit and copied as before, are counted as FP8 too (the
    first and last stages' few per cent)."""
    if not fp8_params(sw, train_dtype):
        return 0.0
    from ...simulator.kernels.fp8_weights import fp8_param_update_kernels
    cast = sum(k.bytes for k in fp8_param_update_kernels(sw.fp8_recipe, n_params))
    return cast - (4.0 + dtype_bytes) * n_params
