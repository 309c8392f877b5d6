"""What one checkpointed decoder layer holds for its backward: the bytes its checkpoint keeps
(:func:`layer_kept_bytes`), whether its backward rebuilds the whole layer
(:func:`rebuilds_layer`) and what the rebuilt layer holds beyond the kept bytes
(:func:`rebuilt_bytes`). The one rule of the exact tier (:mod:`.memory`) and the search tier
(:mod:`ddlsim.search.decodermemory`).
"""

from __future__ import annotations

import numpy as np

from ..models.decoder import DecoderShape
from .sac import op_level, sac_activation_bytes

__all__ = ["rebuilds_layer", "layer_kept_bytes", "whole_layer_kinds", "rebuilt_bytes"]


def rebuilds_layer(sw, recompute: str, moe: bool | None = False) -> bool:
    """Whether a layer's checkpoint spans the whole layer, so that its backward rebuilds the
    layer's activations: full recomputation, and torchtitan's op-level policy, which wraps the
    whole block in one checkpoint (:func:`op_level`); Megatron's selective recomputation
    checkpoints the attention core alone (Korthikanti et al. 2022 §5).

    Parameters
    ----------
    sw : Software
        The resolved software stack.
    recompute : str
        ``train.recompute`` (``none``, ``selective``, ``full``).
    moe : bool or None, optional
        The layer is a Mixture-of-Experts layer (None: the model's kind), as :func:`op_level`
        reads it.

    Returns
    -------
    bool
        True under full recomputation or op-level selective checkpointing.

    References
    ----------
    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §5.
    """
    return recompute == "full" or op_level(sw, recompute, moe)


def layer_kept_bytes(shape: DecoderShape, sw, b, s: int, t, sp: bool, recompute: str,
                     kinds, moe: bool | None = None):
    """Bytes one layer keeps for its backward on one of ``t`` 1-D TP ranks under
    ``recompute`` as the stack ``sw`` runs it: :func:`sac_activation_bytes` under op-level
    selective checkpointing (:func:`op_level`), else Korthikanti et al.'s count
    (:meth:`DecoderShape.layer_activation_bytes` with the keywords ``kinds``). The one rule of
    the exact tier and the search tier; ``b`` and ``t`` may be arrays over plans.

    Parameters
    ----------
    shape : DecoderShape
    sw : Software
        The resolved software stack.
    b, s : micro-batch size; the rank's tokens per sequence (``s/cp``).
    t : TP ranks.
    sp : sequence parallelism.
    recompute : str
        ``train.recompute``.
    kinds : mapping
        :func:`.layerkernels.activation_kinds` of the run under ``recompute``.
    moe : bool, optional
        The layer is a Mixture-of-Experts layer (None: the model's kind).

    Returns
    -------
    float or ndarray
        Bytes.
    """
    if op_level(sw, recompute, moe):
        return sac_activation_bytes(shape, b, s, t, sp)
    return shape.layer_activation_bytes(b, s, t, sp, recompute, moe=moe, **kinds)


def whole_layer_kinds(kinds, sw) -> dict:
    """``kinds`` (:func:`.layerkernels.activation_kinds`) for a layer kept or rebuilt whole:
    its sequence-parallel linears hold their gathered inputs where the stack's autograd saves
    them (:func:`~ddlsim.simulator.kernels.dtensor.keeps_gathered_input` without
    recomputation; a rebuilt layer gathers them again in its recomputed forward).

    Parameters
    ----------
    kinds : mapping
        :func:`.layerkernels.activation_kinds` of the run (keywords of
        :meth:`DecoderShape.layer_activation_bytes`).
    sw : Software
        The resolved software stack.

    Returns
    -------
    dict
        ``kinds`` with ``gathered_input`` set as the stack keeps it without recomputation.
    """
    from ...simulator.kernels.dtensor import keeps_gathered_input
    return {**kinds, "gathered_input": keeps_gathered_input(sw, "none")}


def rebuilt_bytes(whole, kept):
    """Bytes a checkpointed layer holds at the start of its backward beyond what its
    checkpoint kept: its recomputed forward's saved tensors, ``whole − kept``.

    torch's non-reentrant checkpoint (``torch/utils/checkpoint.py`` at pytorch 0008d771:
    ``_checkpoint_hook.unpack_hook`` and ``_recomputation_hook.pack_hook``) reruns the whole
    checkpointed forward at the backward's first unpack of a saved tensor, keeps every tensor
    the rerun saves in ``frame.recomputed`` and lets each go only when the backward node that
    reads it unpacks it; under a selective policy (torchtitan's op-level one) the ops whose
    outputs were saved return them instead of running again. Megatron's reentrant
    ``CheckpointFunction.backward`` (``megatron/core/tensor_parallel/random.py``, Megatron-LM
    d98e8a64 lines 591-659) reruns its forward on the detached inputs likewise before its
    backward. So when the layer's backward starts it holds all it would have held without
    recomputation (``whole``), of which ``kept`` is already counted with the kept layers (the
    checkpoint's input is the tensor the first recomputed op saves). A compiled block
    (AOTAutograd's partitioner) may place each recomputed op just before its first use, which
    would hold less: not modelled.

    Parameters
    ----------
    whole : float or ndarray
        The layer's activations without recomputation, bytes.
    kept : float or ndarray
        What its checkpoint kept for the backward, bytes.

    Returns
    -------
    float or ndarray
        ``max(whole − kept, 0)``, bytes.
    """
    return np.maximum(whole - kept, 0.0) if np.ndim(whole) or np.ndim(kept) else \
        max(whole - kept, 0.0)
