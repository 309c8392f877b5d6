"""A micro-batch's input reaching the device: Megatron-Core's batch, dense attention mask
included, copied from pinned host memory on the compute stream and broadcast over TP.

Megatron-LM core_r0.8.0 (and 900f1b76, 9c1a5351, d7288711) builds a ``[1, s, s]`` causal mask
per sample in the dataset (``gpt_dataset.py``, ``create_attention_mask = True`` unless
``--no-create-attention-mask-in-dataloader``); the data loader pins the collated batch
(``data_samplers.py``, ``pin_memory=True``), and ``training/utils.py``
``get_batch_on_this_tp_rank``, called from ``pretrain_gpt.py`` ``get_batch`` at the start of
each micro-batch's forward on the first and the last pipeline stage (a middle stage returns
before it), has TP rank 0 copy all five tensors with ``.cuda(non_blocking=True)`` on the
current stream, so the micro-batch's kernels wait for the copy, then broadcast some of them
over the TP group with ``torch.distributed.broadcast`` (a synchronous collective: the
stream waits for it), which the other TP ranks receive into empty tensors:

===========================  =====  =========================================================
tensor                       bytes  broadcast on
===========================  =====  =========================================================
``tokens``                   8bs    PP = 1; first stage
``labels``                   8bs    PP = 1; last stage
``loss_mask`` (fp32)         4bs    PP = 1; last stage
``attention_mask`` (bool)    bs²    PP = 1; first stage; last stage
``position_ids``             8bs    PP = 1; first stage
===========================  =====  =========================================================

So a loading stage pays the copy of every tensor at the device's host link
(``system.device.host_link``, the pinned host-to-device rate of one device) and, at TP > 1,
its broadcasts: at ``s = 4,096`` the mask is 16.8 MB a sequence, 0.33 ms at an H100's
50.4 GB/s. The ops open the first stage's embedding (:meth:`.edges.EdgeOps.embedding_forward`)
and follow the last stage's receive (:meth:`.chunks.ChunkOps._chunk_forward`), on the
compute stream. The stack says whether its batch carries the mask
(``software.kernels.batch_attention_mask``): ``dataloader`` is this path; ``device`` (the
2021 stacks build the mask on the GPU, ``get_ltor_masks_and_position_ids``: ~17 s² bytes of
element-wise kernels a micro-batch) and ``none`` (torchtitan, NeMo, Megatron-Bridge: the
kernel masks itself; their few ``b·s`` integer tensors) are not charged. A device without a
``host_link`` is charged no copy, and a result says so (:func:`uncharged_note`).
"""

from __future__ import annotations

from ..trace import Collective, Compute

__all__ = ["ROLES", "batch_tensors", "batch_input_ops", "carries_mask", "uncharged_note"]

#: bytes per token of the batch's per-token tensors (int64 tokens, labels and position ids,
#: fp32 loss mask), and which of them each loading stage broadcasts (module docstring)
_PER_TOKEN = {"tokens": 8, "labels": 8, "loss_mask": 4, "position_ids": 8}
ROLES = {"one": ("tokens", "labels", "loss_mask", "attention_mask", "position_ids"),
         "first": ("tokens", "attention_mask", "position_ids"),
         "last": ("labels", "loss_mask", "attention_mask")}


def carries_mask(sw) -> bool:
    """Whether the stack's batch carries the dataset's dense mask to the device.

    Parameters
    ----------
    sw : Software
        The resolved software features (``batch_attention_mask``).

    Returns
    -------
    bool
        True where ``batch_attention_mask`` is ``dataloader``.
    """
    return getattr(sw, "batch_attention_mask", None) == "dataloader"


def batch_tensors(b: int, s: int) -> dict[str, float]:
    """Bytes of each tensor of one micro-batch of ``b`` sequences of ``s`` tokens, as
    Megatron-Core's ``get_batch_on_this_tp_rank`` copies them (the mask ``[b, 1, s, s]``
    bool).

    Parameters
    ----------
    b : int
        Sequences per micro-batch.
    s : int
        Tokens per sequence.

    Returns
    -------
    dict of str to float
        Tensor name → bytes: ``8bs`` (tokens, labels, position ids), ``4bs`` (loss mask),
        ``bs²`` (attention mask).

    References
    ----------
    Megatron-LM core_r0.8.0 ``megatron/training/utils.py`` ``get_batch_on_this_tp_rank``.
    """
    out = {name: float(width * b * s) for name, width in _PER_TOKEN.items()}
    out["attention_mask"] = float(b) * s * s
    return out


def batch_input_ops(role: str, b: int, s: int, tp: int, host_link, dtype: str) -> list:
    """The loading of one micro-batch's input on a stage of ``role``.

    Parameters
    ----------
    role : str
        ``one`` (PP = 1), ``first`` or ``last`` pipeline stage (:data:`ROLES`).
    b, s : int
        sequences per micro-batch and tokens per sequence.
    tp : int
        tensor-parallel ranks; the broadcasts run at ``tp > 1``.
    host_link : LinkSpec or None
        the device's link from host memory (bytes/s, seconds per copy); None: no copy op.
    dtype : str
        the ops' dtype label (no FLOPs).

    Returns
    -------
    list of Compute and Collective
        the copy of all five tensors (``sum(bytes)/bandwidth_Bps + 5·latency_s`` seconds),
        then one TP broadcast per tensor of ``role``, in Megatron's order.

    References
    ----------
    Megatron-LM core_r0.8.0 ``megatron/training/utils.py`` ``get_batch_on_this_tp_rank``.
    """
    if role not in ROLES:
        raise ValueError(f"batch input role {role!r}; allowed: {', '.join(ROLES)}")
    sizes = batch_tensors(b, s)
    ops: list = []
    if host_link is not None:
        seconds = sum(sizes.values()) / host_link.bandwidth_Bps + len(sizes) * host_link.latency_s
        ops.append(Compute("batch.h2d", 0.0, kind="elementwise", dtype=dtype, seconds=seconds))
    if tp > 1:
        ops += [Collective(f"batch.bcast.{name}", "broadcast", "tp", sizes[name])
                for name in ROLES[role]]
    return ops


def uncharged_note(cfg) -> str | None:
    """What a result says when the stack's batch carries the mask but the device has no
    ``host_link``: the copy is not charged.

    Parameters
    ----------
    cfg : RunConfig
        The validated run config (its model family, software and device).

    Returns
    -------
    str or None
        The note, for a decoder whose stack carries the mask on a device without
        ``system.device.host_link``; None otherwise, and None on a node whose ranks share
        its host memory (``intra_node.kind: shared_memory``: CPU processes, whose batch is
        already in their memory, so there is no copy to charge).
    """
    from . import DecoderFamily
    if not isinstance(cfg.family, DecoderFamily) or not carries_mask(cfg.software) \
            or cfg.system.device.host_link is not None \
            or cfg.system.intra_node.kind == "shared_memory":
        return None
    return ("batch copy not charged: the stack copies each micro-batch's attention mask "
            "from host memory (software.kernels.batch_attention_mask: dataloader) but "
            "system.device.host_link is not set (its TP broadcasts are charged)")
