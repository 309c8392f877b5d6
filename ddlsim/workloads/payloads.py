"""What a trace's blocks are made of: :class:`Op` (a payload placed on a stream, after its
``deps``, ``repeat`` times) and the payloads: :class:`Compute` (with its :class:`Kernel` s and
:class:`Contention`), :class:`Collective`, :class:`P2P`, :class:`Wait` and :class:`Loop`.

Re-exported by :mod:`ddlsim.workloads.trace`, where the trace format is documented
(``docs/trace.md``).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from operator import attrgetter
from typing import Any, Literal

__all__ = ["Compute", "Contention", "Kernel", "Collective", "P2P", "Wait", "Loop", "Op",
           "Payload", "CollectiveOp", "GroupKind"]

CollectiveOp = Literal["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                       "all_to_all", "gather", "scatter", "barrier"]
GroupKind = Literal["dp", "tp", "pp", "ep", "cp", "world"]


class _HashKept:
    """A frozen dataclass whose hash is computed on first use and kept in a slot of its own
    (not a field: neither compared nor pickled, so an unpickled copy, whose strings hash
    otherwise in another process, computes its own): the very value of the generated
    ``hash((field, ...))``, so dicts and sets order alike. For a class whose objects are
    hashed several times each: a search grid hashes a compute op, with its kernels, about
    twice (2,862 hashes of 1,335 ops, 2026-11-30: its op lists and its ops are memo keys),
    the exact engine's predict rarely (12 of 2,106 ops over 21 plans), so the first hash
    pays the slot's look-up and no op pays at its making. A kernel is not kept so: of 8,000
    made over those 21 plans 2,863 are hashed (10,134 times), and kept at its making or on
    its first hash the predicts lost more than a grid gained (valgrind, 2026-11-30)."""

    __slots__ = ("_hash",)
    _hashed: Any   # the hashed fields' attrgetter, set by :func:`_hash_kept`

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:   # the first hash (a field that cannot be hashed raises here)
            h = hash(self._hashed(self))
            object.__setattr__(self, "_hash", h)
            return h


def _hash_kept(cls):
    """``cls``, a frozen dataclass deriving :class:`_HashKept` (whose body sets ``__hash__ =
    _HashKept.__hash__``, so that the dataclass keeps it), with the fields its hash reads,
    as the generated hash reads them (the compared ones, or those with ``hash=True``)."""
    names = [f.name for f in fields(cls) if (f.compare if f.hash is None else f.hash)]
    cls._hashed = attrgetter(*names)
    return cls


def _quick_init(cls):
    """``cls``, a frozen dataclass with slots, whose ``__init__`` sets each field through its
    slot (the member descriptor's ``__set__``) instead of ``object.__setattr__`` by name, as
    the generated one does: the same parameters, defaults and ``__post_init__``, about 40 %
    less time per object (a search grid makes ~8,000 ops, payloads and kernels; a 1,024-GPU
    predict as many per plan). A frozen dataclass without slots gets its fields in its
    ``__dict__`` at once, in field order (the decoder's 43-field plan: 14.8 → 8.3 µs, one per
    search signature). Only for fields with plain defaults (no factory, no init=False)."""
    params, body = [], []
    space: dict[str, Any] = {}
    slotted = "__slots__" in cls.__dict__
    for f in fields(cls):
        if f.default_factory is not MISSING or not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: _quick_init takes plain fields only")
        if f.default is MISSING:
            params.append(f.name)
        else:
            space[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        if slotted:
            space[f"_set_{f.name}"] = getattr(cls, f.name).__set__
            body.append(f"_set_{f.name}(self, {f.name})")
    if not slotted:
        body.append("self.__dict__.update({"
                    + ", ".join(f"{f.name!r}: {f.name}" for f in fields(cls)) + "})")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    exec(f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body), space)
    init = space["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = {**{f.name: f.type for f in fields(cls)}, "return": None}
    cls.__init__ = init
    return cls


@_quick_init
@dataclass(frozen=True, slots=True)
class Kernel:
    """One device kernel of a :class:`Compute` op, for the kernel-level compute model
    (:mod:`ddlsim.simulator.kernels`, docs/compute.md).

    ``kind``: ``gemm`` (``batch`` independent ``C[M,N] = A[M,K]·B[K,N]`` in one launch,
    ``shape = (M, N, K)``), ``flash`` (a FlashAttention kernel ``variant`` doing ``flops``
    and moving ``bytes``, its ``batch`` the (sequence, head) pairs of the launch, whose tiles
    :mod:`ddlsim.simulator.kernels.attention_tiles` schedules on the SMs) or ``memory`` (a
    streaming kernel reading + writing ``bytes``).
    A ``gemm`` with ``bytes`` set moves those in its memory roofline instead of its operands'
    (an implicit-GEMM convolution, :mod:`ddlsim.workloads.resnet.kernels`; a weight gradient
    accumulating into ``main_grad``, :mod:`ddlsim.workloads.decoder.wgrad`); 0: its operands'.
    ``accumulate_bytes``: a ``gemm`` that accumulates into a buffer (``β = 1``), the buffer's
    bytes per element, which its epilogue reads and writes (:mod:`.decoder.wgrad`); 0: it
    writes a fresh output.
    """

    kind: Literal["gemm", "flash", "memory"]
    shape: tuple[float, float, float] = (0.0, 0.0, 0.0)
    batch: float = 1.0
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    variant: str = ""
    accumulate_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("gemm", "flash", "memory"):
            raise ValueError(f"kernel kind must be gemm, flash or memory, not {self.kind!r}")


@_hash_kept
@_quick_init
@dataclass(frozen=True, slots=True)
class Compute(_HashKept):
    """Work on the device: ``flops`` floating-point operations reading/writing ``bytes``.

    ``kind`` selects the efficiency model: ``gemm``, ``attention``, ``elementwise``,
    ``optimizer``. ``dtype`` is the arithmetic precision (a key of the device's peak_flops).
    ``seconds``, when set, is the op's duration as given (a proxy's ``usleep``, a measured
    kernel): engines use it as is and the cost model is not consulted; ``flops`` still counts
    towards the achieved FLOP/s. ``kernels``, when set, are the device kernels the op runs
    (GEMM shapes, attention, memory passes): the cost model times the op as the sum of its
    kernels (docs/compute.md) and ``flops``/``bytes`` only count; families that give flops and
    bytes alone keep the roofline at the device's matmul ceiling.
    """

    __hash__ = _HashKept.__hash__   # in the body, so that the dataclass keeps it

    name: str
    flops: float
    bytes: float = 0.0
    kind: str = "gemm"
    dtype: str = "bf16"
    seconds: float | None = None
    kernels: tuple[Kernel, ...] | None = None
    #: set on an op that stands for the *extra* time of GEMMs overlapped with communication
    #: kernels holding SMs (:class:`Contention`, :mod:`ddlsim.simulator.kernels.contention`)
    contention: Contention | None = None
    #: host seconds the framework spends on the op beyond its kernels' dispatch and launch
    #: (:mod:`ddlsim.simulator.kernels.host`: ``max(Σ t + n·g, n·h + host_s)``), e.g. the
    #: Python policy of torch's selective checkpointing per ATen op (:mod:`.decoder.sac`)
    host_s: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"compute {self.name!r}: seconds must be finite and >= 0, "
                             f"got {self.seconds!r}")
        if not (math.isfinite(self.host_s) and self.host_s >= 0):
            raise ValueError(f"compute {self.name!r}: host_s must be finite and >= 0, "
                             f"got {self.host_s!r}")


@_quick_init
@dataclass(frozen=True, slots=True)
class Collective:
    """A collective on the rank's member of group family ``group``."""

    name: str
    op: CollectiveOp
    group: str
    bytes: float
    root: int = 0
    split_bytes: tuple[float, ...] | None = None  # uneven all_to_all: bytes to each member
    algorithm: str | None = None  # None: the run's choice for this op (or auto)
    split_by: Literal["receiver", "sender"] = "receiver"  # what split_bytes is indexed by

    def __post_init__(self) -> None:
        if self.split_by not in ("receiver", "sender"):
            raise ValueError(f"collective {self.name!r}: split_by must be 'receiver' or "
                             f"'sender', not {self.split_by!r}")
        if self.split_bytes is None:
            if self.split_by != "receiver":
                raise ValueError(f"collective {self.name!r}: split_by = {self.split_by!r} "
                                 "needs split_bytes")
            return
        split = tuple(float(b) for b in self.split_bytes)
        if self.op != "all_to_all":
            raise ValueError(f"collective {self.name!r}: split_bytes is for all_to_all only, "
                             f"not {self.op!r}")
        if any(not b >= 0 for b in split):
            raise ValueError(f"collective {self.name!r}: split_bytes must be >= 0, got {split}")
        if abs(sum(split) - self.bytes) > 1e-9 * max(self.bytes, 1.0):
            raise ValueError(f"collective {self.name!r}: bytes = {self.bytes} must equal "
                             f"sum(split_bytes) = {sum(split)} (split_by receiver: the total "
                             "each rank sends; sender: the total each rank receives)")
        object.__setattr__(self, "split_bytes", split)


@_quick_init
@dataclass(frozen=True, slots=True)
class Contention:
    """What holds SMs while ``gemm_flops`` of overlapped GEMMs run (the op carrying it takes
    the GEMMs' extra time, :mod:`ddlsim.simulator.kernels.contention`): ``sms`` SMs for the
    GEMMs' whole duration (TransformerEngine's ``set_sm_margin``), or — with
    ``collectives`` — for as long as those collectives run, ``sms`` SMs (a kernel with its
    own SM count: DeepEP's ``num_sms``) or, with ``sms`` 0, NCCL's channels."""

    gemm_flops: float
    sms: int = 0
    collectives: tuple[Collective, ...] = ()
    #: issues of each of ``collectives`` one after another (empty: one each), so a bucket
    #: issued a million times is one entry, not a million
    counts: tuple[int, ...] = ()

    def issues(self) -> tuple[tuple[Collective, int], ...]:
        """Each collective with how many times it is issued."""
        return tuple(zip(self.collectives, self.counts or (1,) * len(self.collectives)))


@_quick_init
@dataclass(frozen=True, slots=True)
class P2P:
    """Point-to-point ``send``/``recv`` with the member ``peer`` places away in ``group``.

    A send matches the recv on the peer with the same ``tag`` and micro-batch whose ``peer``
    points back. Peers wrap around the group (the last pipeline stage's ``+1`` is stage 0, as
    the interleaved schedule needs).
    """

    name: str
    kind: Literal["send", "recv"]
    group: str
    peer: int
    bytes: float
    tag: str


@_quick_init
@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until everything issued so far on ``stream`` has finished (a stream join)."""

    name: str
    stream: str


@_quick_init
@dataclass(frozen=True, slots=True)
class Loop:
    """``count`` iterations of ``body`` issued back to back (``count`` × the op's ``repeat``).

    Body ops keep their streams; their ``deps`` index earlier ops of the same iteration. The
    loop op's ``deps`` hold back the first iteration; an op depending on the loop waits for its
    last iteration. Streams keep issue order, so a communication stream runs ahead of the
    compute stream (prefetch) exactly as if the ops were written out one by one.
    """

    name: str
    body: tuple["Op", ...]
    count: int

    def __post_init__(self) -> None:
        if not self.body or not (isinstance(self.count, int) and self.count >= 1):
            raise ValueError(f"loop {self.name!r}: needs a body and count >= 1, got "
                             f"{len(self.body)} ops and count = {self.count!r}")
        object.__setattr__(self, "body", tuple(self.body))


Payload = Compute | Collective | P2P | Wait | Loop


@_quick_init
@dataclass(frozen=True, slots=True)
class Op:
    """An op placed in a block: what, on which stream, after which earlier ops, how often."""

    payload: Payload
    stream: str = "compute"
    deps: tuple[int, ...] = ()
    repeat: int = 1

    @property
    def name(self) -> str:
        return self.payload.name
