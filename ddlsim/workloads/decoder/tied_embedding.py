"""The tied word embedding's gradient all-reduce between the first and last pipeline stages.

With tied input and output embeddings and PP > 1, the first stage holds the input embedding
and the last stage a copy of the same ``V × h`` matrix as the output head (Megatron-LM
6985e58 ``megatron/model/module.py`` ``initialize_word_embeddings``: "a second copy of
word_embeddings on the last stage"; :func:`.builder.with_edges` counts it). After the
backward and the data-parallel gradient sync, and before the optimizer step, each pair of
copies' gradients is all-reduced over the two-rank *embedding group*: the first and the last
stage of one pipeline (same tensor-parallel rank and data-parallel replica), so that both
copies take the same step.

* Megatron-LM 6985e58 (2021) ``megatron/training.py`` lines 376-397 (``train_step``): after
  ``allreduce_gradients`` (``--DDP-impl local``) and before ``optimizer.step()``,
  ``torch.distributed.all_reduce(word_embeddings_weight.main_grad,
  group=mpu.get_embedding_group())`` on the first and last stages.
* Megatron-Core core_r0.8.0 ``megatron/core/distributed/finalize_model_grads.py``
  ``_allreduce_word_embedding_grads``: the same all-reduce of
  ``shared_embedding_or_output_weight().main_grad`` over ``get_embedding_group()``, called by
  ``finalize_model_grads`` after ``finish_grad_sync`` (the data-parallel sync) and before the
  step; skipped when ``share_embeddings_and_output_weights`` is off
  (``--untie-embeddings-and-output-weights``; ddlsim's ``model.tie_word_embeddings: false``).

Bytes: the whole gradient buffer of the rank's embedding shard, ``V·h/t`` elements in the
stack's gradient dtype (``main_grad``: fp32 where ``grad_reduce_dtype`` says so, e.g. bf16
training and Megatron-Core's distributed optimizer), even under ZeRO-1/2: Megatron
all-reduces the full ``main_grad`` whatever the optimizer then reads of it. Under ZeRO-3 the
rank keeps only its ``1/D`` shard of the gradient, and ddlsim all-reduces that shard (no stack
here has a source for tied weights across stages under ZeRO-3: an assumption, not a reading).
The call is synchronous (``torch.distributed.all_reduce`` on the current stream): the op is on
the compute stream, just before the step's grad-norm wait (:mod:`.host_sync`) or, without one,
the step itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..trace import Block, Collective, GroupFamily, Op, insert_before, insert_op

__all__ = ["GROUP", "OP_NAME", "STEP_OPS", "charged", "embedding_grad_bytes", "families", "family_of",
           "grad_bytes", "insert_op", "with_grad_all_reduce"]

#: name of the embedding group's family (first and last stage of each pipeline)
GROUP = "embedding"
#: name of the all-reduce op in the update block
OP_NAME = "embedding.grad.all_reduce"
#: ops before which the all-reduce goes, the first found (:mod:`.host_sync`'s grad-norm wait,
#: else the optimizer step)
#: the update block's ops a gradient exchange before the step goes in front of, first found
STEP_OPS = ("grad_norm.sync", "optimizer")


def charged(shape: Any, pp: int, mtp: int = 0) -> bool:
    """Whether the embedding's two copies sit on different stages: tied, or with multi-token
    prediction (``mtp`` depths: the MTP stage's own copy of the input embedding,
    :mod:`.mtp`; Megatron-LM d98e8a64 finalize_model_grads.py line 146,
    ``_get_shared_word_embedding_weight``: ``share_embeddings_and_output_weights or
    mtp_num_layers``), and PP > 1."""
    return bool(shape.tied_embeddings or mtp) and pp > 1


def families(b: Any, mesh: Any) -> dict[str, GroupFamily]:
    """The ``embedding`` family of builder ``b``'s plan on ``mesh``: per pipeline group, its
    first and last rank (kind ``pp``: the network model routes it where those ranks sit);
    none when untied or PP = 1.

    Parameters
    ----------
    b : StageBuilder
        The plan's builder (``shape``, ``pp``).
    mesh : DeviceMesh
        The run's mesh.

    Returns
    -------
    dict
        ``{"embedding": GroupFamily}`` or ``{}``.
    """
    if not charged(b.shape, b.pp, b.mtp):
        return {}
    pipes = mesh.groups("pp")
    if b.plan.dp_strategy == "reduce_broadcast" and b.dp > 1:
        # only the roots step (:func:`with_grad_all_reduce`): the family is their groups,
        # so that the network model shares the links among the groups that run it
        pipes = pipes[np.isin(pipes[:, 0], mesh.groups("dp")[:, 0])]
    return {GROUP: family_of(pipes)}


def family_of(pipes: np.ndarray) -> GroupFamily:
    """The ``embedding`` family of pipeline groups ``pipes`` (rows of ranks, stage order):
    each row's first and last rank."""
    return GroupFamily(GROUP, "pp", np.asarray(pipes)[:, [0, -1]])


def grad_bytes(b: Any) -> float:
    """Bytes each rank all-reduces for builder ``b``'s plan (:func:`embedding_grad_bytes`).

    Parameters
    ----------
    b : StageBuilder
        The plan's builder.

    Returns
    -------
    float
        bytes, the buffer each rank passes in.
    """
    return float(embedding_grad_bytes(b.shape.vocab, b.shape.hidden, b.part.param_split, b.gdt,
                                      b.plan.zero_stage, b.gdp))


def embedding_grad_bytes(vocab, hidden, param_split, gdt, zero_stage, gdp):
    """Bytes each rank all-reduces: its ``V·h/split`` embedding gradient in the stack's
    gradient dtype, its ``1/D`` shard under ZeRO-3 with ``D > 1`` (module docstring); the
    builder's op and the search tier's arrays of plans both take their bytes from here.

    Parameters
    ----------
    vocab, hidden : int
        The model's vocabulary and hidden sizes.
    param_split : int or numpy.ndarray
        Ranks the embedding's parameters are split over (the tensor-parallel size in 1-D).
    gdt : float
        Bytes per gradient element.
    zero_stage, gdp : int or numpy.ndarray
        ZeRO stage and the gradient-sharding group's size, per plan.

    Returns
    -------
    float or numpy.ndarray
        bytes, per plan.
    """
    n = vocab * hidden / np.asarray(param_split, dtype=float) * gdt
    sharded = (np.asarray(zero_stage) == 3) & (np.asarray(gdp) > 1)
    return np.where(sharded, n / np.maximum(np.asarray(gdp, dtype=float), 1.0), n)


def with_grad_all_reduce(b: Any, block: Block, stage: int) -> Block:
    """``block`` (a stage's ``update`` block) with the embedding gradient's all-reduce
    inserted on the compute stream before the step (module docstring), on the first and last
    stage of a tied plan with PP > 1; ``block`` itself elsewhere, and on a rank that does not
    step (the reduce-to-root strategy's others: their embedding-group peers do not step
    either).

    Parameters
    ----------
    b : StageBuilder
        The plan's builder.
    block : Block
        The stage's update block.
    stage : int
        Pipeline stage index.

    Returns
    -------
    Block
        The block with the op inserted, later ops' dependencies shifted past it.
    """
    if not charged(b.shape, b.pp, b.mtp) or stage not in (0, b.pp - 1):
        return block
    return insert_before(block, STEP_OPS,
                         [Op(Collective(OP_NAME, "all_reduce", GROUP, grad_bytes(b)))])
