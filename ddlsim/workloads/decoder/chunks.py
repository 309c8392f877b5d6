"""The forward and backward blocks of one model chunk of a decoder's pipeline stage: the
receive of its input (and Megatron's scatter-gather all-gather after it), its layers, the
embedding on the first virtual stage and the head on the last, and the send of its output.
Mixed into :class:`~ddlsim.workloads.decoder.builder.StageBuilder`; what it reads is declared
in :class:`.stage.StageBase`."""

from __future__ import annotations

from ..trace import Block, Collective, Op, P2P, Wait
from .layerkinds import moe_layers_in_chunk
from .stage import StageBase

__all__ = ["ChunkOps", "as_ops"]


def as_ops(items: list) -> list[Op]:
    """Trace payloads wrapped as ops on the compute stream; ops (a partitioner's, with their
    streams and deps) as they are."""
    return [x if isinstance(x, Op) else Op(x) for x in items]


class ChunkOps(StageBase):
    """Blocks of one model chunk (a mixin of ``StageBuilder``: the layers' ops are its
    ``layer_ops``, the embedding and head :class:`.edges.EdgeOps`', the backward that
    overlaps the gradient sync :class:`.dpsync.GradSyncOps`')."""

    def gather_ops(self, tag: str, deps: tuple[int, ...] = ()) -> list[Op]:
        """What follows the receive of a stage's input: the all-gather of Megatron's
        scatter-gather (Narayanan 2021 §4.1), or nothing (:meth:`.partition.base.Partitioner.
        boundary`)."""
        gather = self.part.boundary(self.act_bytes)[1]
        if gather is None:
            return []
        return [Op(Collective(f"{tag}.gather", "all_gather", "tp", gather), deps=deps)]

    def _recv_ops(self, tag: str, peer: int) -> list[Op]:
        """The receive of ``tag`` from the stage ``peer`` away, and the gather after it."""
        blocking = not self.plan.p2p_overlap

        def make() -> list[Op]:
            # blocking P2P: the receive is posted where Megatron calls it, after this
            # rank's previous compute (a Wait on the compute stream), not ahead
            ops = [Op(Wait("p2p.post", "compute"))] if blocking else []
            ops.append(Op(P2P(f"recv.{tag}", "recv", "pp", peer,
                              self.part.boundary(self.act_bytes)[0], tag),
                          stream="pp", deps=(0,) if blocking else ()))
            ops += self.gather_ops(tag, deps=(len(ops) - 1,))
            return ops
        return self.cached(("recv", tag, peer, blocking), make)

    def _send_op(self, tag: str, peer: int, dep: int) -> Op:
        """The send of ``tag`` to the stage ``peer`` away, after op ``dep``."""
        return self.cached(("send", tag, peer, dep), lambda: Op(
            P2P(f"send.{tag}", "send", "pp", peer, self.part.boundary(self.act_bytes)[0], tag),
            stream="pp", deps=(dep,)))

    def _after(self, op: Op, dep: int) -> Op:
        """``op`` made to depend on op ``dep``."""
        # keyed by the op's identity: hashing a layers' loop hashes every op in it; the
        # entry keeps ``op``, so its id is not reused by another op while the entry lives
        return self.cached(("after", id(op), dep), lambda: (
            op, Op(op.payload, op.stream, (dep,), op.repeat)))[1]

    def chunk_blocks(self, stage: int, chunk: int, sync_ops: list[Op] | None) -> dict[str, Block]:
        """Forward and backward blocks of one model chunk of ``stage`` (and, if ``sync_ops``
        is given, the variant of the backward that overlaps the gradient sync)."""
        Lc = self.split[stage][chunk]
        n_moe = (moe_layers_in_chunk(self.shape, self.split, stage, chunk)
                 if self.shape.is_moe else 0)
        blocks = {f"F{chunk}": Block(f"F{chunk}", "forward",
                                     tuple(self._chunk_forward(stage, chunk, n_moe))),
                  f"B{chunk}": Block(f"B{chunk}", "backward",
                                     tuple(self._chunk_backward(stage, chunk, n_moe, None)))}
        if sync_ops or (sync_ops is not None and Lc == 0 and self._syncs_gradients()):
            # a chunk without a layer syncs nothing, but the schedule names its .sync block
            blocks[f"B{chunk}.sync"] = Block(f"B{chunk}.sync", "backward", tuple(
                self._chunk_backward(stage, chunk, n_moe, sync_ops)))
        return blocks

    def _chunk_forward(self, stage: int, chunk: int, n_moe: int) -> list[Op]:
        """The chunk's forward (``n_moe`` of its layers MoE layers): receive (or embedding),
        layers, send (or head)."""
        # tags name the receiving chunk, so every middle stage has the same blocks (the last
        # stage's chunk c feeds chunk c + 1 of stage 0 in the interleaved schedule)
        k = chunk * self.pp + stage           # virtual stage index
        fwd: list[Op] = []
        if k > 0:
            fwd += self._recv_ops(f"act.c{chunk}", -1)
        if k == self.pp * self.v - 1 and k > 0:
            # the last stage loads its batch after the receive (Megatron's forward_step
            # runs get_batch once recv_forward has returned): .batch_input
            load = self.cached(("batch.last",), lambda: as_ops(self.batch_ops("last")))
            if load:
                fwd += [self._after(load[0], len(fwd) - 1), *load[1:]]
        if k == 0:
            fwd += self.cached(("embedding",), lambda: as_ops(self.embedding_forward()))
        first = len(fwd)
        fwd += self.layer_ops(False, self.split[stage][chunk], n_moe)
        if fwd[:first] and len(fwd) > first:   # a chunk may hold no layer (.split)
            fwd[first] = self._after(fwd[first], first - 1)
        if k == self.pp * self.v - 1:
            fwd += self.cached(("head",), lambda: as_ops(self.head_forward()))
        else:
            to = chunk + (1 if stage == self.pp - 1 else 0)
            fwd.append(self._send_op(f"act.c{to}", +1, len(fwd) - 1))
        return fwd

    def _chunk_backward(self, stage: int, chunk: int, n_moe: int,
                        sync_ops: list[Op] | None) -> list[Op]:
        """The chunk's backward (``n_moe`` as :meth:`_chunk_forward`): receive (or the head's
        backward), layers (overlapping the gradient sync when ``sync_ops`` is given and not
        empty), send of the input gradient (or the embedding's backward)."""
        k = chunk * self.pp + stage
        Lc = self.split[stage][chunk]
        offset = sum(self.split[stage][:chunk])    # the rank's layers before this chunk
        ops: list[Op] = []
        if k < self.pp * self.v - 1:
            ops += self._recv_ops(f"grad.c{chunk}", +1)
        else:
            ops += self.cached(("head.bwd",), lambda: as_ops(self.head_backward()))
        start = len(ops)
        # the input embedding's weight gradient (.embedding_grad), in the last bucket
        emb = tuple(self.cached(("embedding.bwd",), lambda: as_ops(
            self.embedding_backward()))) if k == 0 else ()
        if sync_ops:
            # the first stage's first chunk's buckets (dense and expert) get their DDP
            # passes and host waits here (.dpsync.GradSyncOps.bucket_pass_ops)
            ops += self._overlapped_layers(sync_ops, start, Lc, offset, passes=(
                stage == 0 and chunk == 0), after=emb)
        else:
            ops += [*self.layer_ops(True, Lc, n_moe, offset), *emb]
        if ops[:start] and len(ops) > start:
            ops[start] = self._after(ops[start], start - 1)
        if k > 0:
            last_compute = next(i for i in range(len(ops) - 1, -1, -1)
                                if ops[i].stream == "compute")
            to = chunk - (1 if stage == 0 else 0)
            ops.append(self._send_op(f"grad.c{to}", -1, last_compute))
        return ops

    def _syncs_gradients(self) -> bool:
        """Whether the plan reduces gradients over data parallelism (as
        :meth:`.dpsync.GradSyncOps.grad_sync_ops` decides)."""
        return self.gdp > 1 or (self.split_experts and self.plan.edp > 1)
