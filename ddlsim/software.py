"""The software stack a run uses: which kernels are fused and which overlaps are on.

``system.software`` names a stack from ``ddlsim/data/software.yaml`` (``megatron-lm-2021``,
``megatron-core-2024``, ``deepspeed``, …) or gives one as a mapping that starts from a named
stack and overrides some of its fields::

    software: megatron-core-2024
    software: {stack: megatron-lm-2021, kernels: {attention: flash2}}

Two parts, each with its defaults cited in the YAML:

* ``kernels`` — how the compute runs: the attention kernel, which element-wise ops are fused,
  the optimizer kernel, FP8 details. Read by the compute cost model and the activation-memory
  formulas.
* ``overlap`` — which communication hides behind compute (Megatron-Core's option names). The
  plan may override each one (``parallel.overlap_grad_reduce`` etc.); a plan field left unset
  takes the stack's value.

:mod:`ddlsim.software_fields` declares the two parts' fields; here the stacks are read and
:func:`resolve_software` merges the three layers (stack ← ``system.software`` overrides ←
plan options) into a frozen :class:`Software`.

The ``zero3_*`` fields are read by ZeRO-3 plans only: one plan below stage 3 that sets one
itself is refused (:func:`check_zero3_fields`, called by :func:`ddlsim.load_config`).

Each stack also lists, under ``rules:``, the plans its framework cannot run, each rule with its
source (:mod:`ddlsim.stackrules`); ``{stack: …, what_if: true}`` predicts such a plan anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from pydantic import Field, StrictBool, model_validator

from .config_types import DTYPE_BYTES, _Strict
from .errors import ConfigError, did_you_mean
# the stack's fields, importable from here as before (their types: .software_fields)
from .software_fields import GemmLibrary, KernelSpec, OverlapSpec, TPCommOverlap
# the ZeRO-3 fields' checks (check_zero3_fields importable from here as before)
from .software_zero3 import (ALTERNATIVE_ZERO3, ZERO3_FIELDS, check_gather_options,  # noqa: F401
                             check_implementation, check_zero3_fields)

__all__ = ["KernelSpec", "OverlapSpec", "SoftwareSpec", "Software", "stacks", "stack_entry",
           "resolve_software", "check_zero3_fields", "grad_dtype_bytes", "DEFAULT_STACK",
           "GemmLibrary", "TPCommOverlap"]


#: The stack a system without ``software`` runs: what a user training a decoder today runs.
DEFAULT_STACK = "megatron-core-2024"



class SoftwareSpec(_Strict):
    """``system.software`` as a mapping: a named stack and the fields it overrides."""

    stack: str = DEFAULT_STACK
    kernels: KernelSpec = Field(default_factory=KernelSpec)
    overlap: OverlapSpec = Field(default_factory=OverlapSpec)
    what_if: StrictBool = Field(
        default=False, description="predict a plan the stack cannot run (its rules in "
                                   "software.yaml) anyway, marked as a what-if")
    compile: StrictBool | None = Field(
        default=None, description="short for kernels.compile (torch.compile of each "
                                  "transformer block, torchtitan)")
    source: str | None = None

    @model_validator(mode="after")
    def _known(self) -> "SoftwareSpec":
        if self.compile is not None:
            if self.kernels.compile not in (None, self.compile):
                raise ValueError(f"compile = {self.compile} contradicts kernels.compile = "
                                 f"{self.kernels.compile}; give one of them")
            object.__setattr__(self, "kernels",
                               self.kernels.model_copy(update={"compile": self.compile}))
        if self.stack not in stacks():
            raise ValueError(f"stack {unknown_stack(self.stack)}")
        return self


@dataclass(frozen=True)
class Software:
    """A resolved stack: every field set. ``kernels``/``overlap`` map field → value,
    ``sources`` field → where its default comes from."""

    name: str
    kernels: dict[str, Any]
    overlap: dict[str, Any]
    sources: dict[str, str]
    #: run plans the stack's rules refuse (:mod:`ddlsim.stackrules`), as a what-if
    what_if: bool = False

    def __post_init__(self) -> None:
        # Every field of the stack as an attribute of its own, kernels' over overlap's as
        # :meth:`__getattr__` gives them: a search grid reads ~5,000 of them, each a failed
        # look-up (an AttributeError raised and caught inside Python) before __getattr__ ran.
        # The class's own names (the dataclass fields, methods) keep their meaning.
        own = {**self.overlap, **self.kernels}
        for name in _CLASS_NAMES.intersection(own):
            del own[name]
        self.__dict__.update(own)

    def __getattr__(self, field: str) -> Any:
        if field in _SOFTWARE_FIELDS or field.startswith("__"):
            raise AttributeError(field)   # not set yet (copy, pickle): no lookup through them
        for part in (self.kernels, self.overlap):
            if field in part:
                return part[field]
        raise AttributeError(field)

    def __hash__(self) -> int:
        # computed once per object (the speed grid of benchmarks/search_speed.py hashes its
        # stacks 266 times, each a sort of 47 fields: 1.7 % of a cold grid, py-spy
        # 2026-11-30); the fields are never changed after construction. Not pickled
        # (:meth:`__getstate__`): a string's hash differs between processes.
        got = self.__dict__.get("_Software__hash")
        if got is None:
            got = hash((self.name, tuple(sorted(self.kernels.items())),
                        tuple(sorted(self.overlap.items())), self.what_if))
            self.__dict__["_Software__hash"] = got
        return got

    def __getstate__(self) -> dict:
        """The object's attributes less its remembered hash (see :meth:`__hash__`)."""
        return {k: v for k, v in self.__dict__.items() if k != "_Software__hash"}


#: :class:`Software`'s dataclass fields, and every name its class has: a stack field of one
#: of these names stays behind it (read through ``kernels``/``overlap``)
_SOFTWARE_FIELDS = frozenset(f.name for f in fields(Software))
_CLASS_NAMES = _SOFTWARE_FIELDS | frozenset(dir(Software))


@lru_cache(maxsize=1)
def _stack_table() -> dict[str, dict]:
    from importlib import resources

    from .documents import load_bundled_yaml
    return load_bundled_yaml(resources.files("ddlsim.data").joinpath("software.yaml").read_text())


def stacks() -> list[str]:
    """The named stacks, in file order."""
    return list(_stack_table())


#: A framework's word in a stack name users type, and the named stacks that framework is
#: (their sources in data/software.yaml).
_STACK_WORDS = (
    ("fsdp", "FSDP2 (a unit per transformer block) is the torchtitan-2024 and "
             "torchtitan-2025 stacks, PyTorch's FSDP1 fms-fsdp-2024; FSDP itself is "
             "parallel.zero_stage: 3"),
    ("nemo", "NeMo trains with Megatron-Core: megatron-core-2024 (NeMo 24.07) or "
             "megatron-core-2025"),
    ("bridge", "Megatron-Bridge trains with Megatron-Core: megatron-core-2025"),
    ("mcore", "Megatron-Core is megatron-core-2024 or megatron-core-2025"),
)


def unknown_stack(name: object) -> str:
    """Why ``name`` is not a stack: ``"'x' is not a known software stack …; allowed: …"``,
    with the closest name, or the stacks of the framework a word in it names."""
    known = stacks()
    word = next((hint for w, hint in _STACK_WORDS if w in str(name).lower()), None)
    why = f": {word}" if word else did_you_mean(name, known)
    return f"{name!r} is not a known software stack{why}; allowed: {', '.join(known)}"


def stack_entry(name: str) -> dict:
    """The stack ``name`` as ``data/software.yaml`` writes it: its fields, each a value and
    its source, and its rules; an unknown name is refused with the known ones."""
    table = _stack_table()
    if name not in table:
        raise ConfigError(unknown_stack(name))
    return table[name]


def plan_defaults(name: str) -> dict[str, Any]:
    """The plan fields the stack ``name``'s runs have where a config leaves them unset (its
    ``plan:`` entry in software.yaml, each ``{value, source}``): field → value."""
    return {f: item["value"] for f, item in (stack_entry(name).get("plan") or {}).items()}


def _stack_defaults(name: str) -> tuple[dict, dict, dict]:
    """(kernels, overlap, sources) of a named stack: each YAML field is ``{value, source}``."""
    entry = _stack_table()[name]
    parts: list[dict] = [{}, {}]
    sources: dict[str, str] = {}
    for i, section in enumerate(("kernels", "overlap")):
        for field, item in entry[section].items():
            parts[i][field] = item["value"]
            sources[field] = item["source"]
    return parts[0], parts[1], sources


#: :func:`resolve_software`'s results by what they derive from (:func:`_resolved_key`)
_RESOLVED: dict[tuple, tuple] = {}
_RESOLVED_MAX = 256


def resolve_software(spec: SoftwareSpec | str | None, plan: Any = None,
                     stall: str | None = None) -> Software:
    """The stack ``spec`` names, with its overrides and then the plan's overlap options and
    ``cp_comm_type`` (``plan.<field>`` when the plan sets it, i.e. is not None) applied.

    Resolved once per ``spec`` object (or name) and the plan's values of the stack's fields,
    the only things it reads (:func:`_resolved_key`); every later call with equal ones gets
    the same (frozen) :class:`Software`: a search builds many plans' configs that differ in
    their parallel sizes only (62 ``parallel`` sections a cold speed grid of
    ``benchmarks/search_speed.py``, one stack). :func:`cache_clear` forgets them.

    ``stall``: why the system's collective library does not move a non-blocking collective
    while the rank computes (:func:`~ddlsim.config_system.progress_stall`), or None: then
    ``overlap_grad_reduce`` resolves to false, its source saying why, and a user's ``true``
    is warned about (:func:`_stalled`).

    Raises
    ------
    ConfigError
        if ``spec`` names an unknown stack, or sets a ZeRO-3 option its gather mode ignores
        (raised anew on every call: a failure is not remembered).
    """
    key = _resolved_key(spec, plan)
    if key is None:
        return _resolve(spec, plan, stall)
    key = (*key, stall)
    hit = _RESOLVED.get(key)
    if hit is None:
        # the spec kept: its id stays its
        hit = _RESOLVED[key] = (spec, _resolve(spec, plan, stall))
        if len(_RESOLVED) > _RESOLVED_MAX:
            del _RESOLVED[next(iter(_RESOLVED))]
    return hit[1]


def _resolved_key(spec: SoftwareSpec | str | None, plan: Any) -> tuple | None:
    """What :func:`_resolve` reads: the spec (by identity: a frozen model; a name or None by
    value) and, of a pydantic ``plan`` (or none), the values of the fields :func:`_apply_plan`
    reads (:func:`_plan_fields`); None where that cannot be a key (another kind of plan, a
    stack name unknown, a value that is not hashable): resolved without the cache."""
    spec_key = spec if spec is None or isinstance(spec, str) else id(spec)
    if plan is None:
        return (spec_key, None)
    known = getattr(type(plan), "model_fields", None)
    stack = spec if isinstance(spec, str) else DEFAULT_STACK if spec is None else spec.stack
    if known is None or stack not in _stack_table():
        return None
    fields = _plan_fields(stack, type(plan))
    key = (spec_key, type(plan), *(getattr(plan, f, None) for f in fields))
    try:
        hash(key)
    except TypeError:
        return None
    return key


@lru_cache(maxsize=None)
def _plan_fields(stack: str, plan_type: type) -> tuple[str, ...]:
    """The fields of ``stack`` (kernels, then overlap) that a plan of ``plan_type`` (a pydantic
    model) has: those :func:`_apply_plan` reads from it."""
    kernels, overlap, _ = _stack_defaults(stack)
    return tuple(f for part in (kernels, overlap) for f in part if f in plan_type.model_fields)


def cache_clear() -> None:
    """Forget the resolved stacks (:func:`resolve_software`; for timing a cold run)."""
    _RESOLVED.clear()


def _resolve(spec: SoftwareSpec | str | None, plan: Any = None,
             stall: str | None = None) -> Software:
    """:func:`resolve_software`'s work, every call."""
    spec = _as_spec(spec)
    kernels, overlap, sources = _stack_defaults(spec.stack)
    for part, given, where in ((kernels, spec.kernels, "system.software.kernels"),
                               (overlap, spec.overlap, "system.software.overlap")):
        for field, value in given.model_dump(exclude_none=True).items():
            part[field], sources[field] = value, where
    _apply_plan((kernels, overlap), sources, plan)
    if stall is not None:
        _stalled(overlap, sources, stall)
    if kernels["compile"]:
        _compiled(kernels, sources)
    check_gather_options(overlap, sources, spec.stack)
    check_implementation(spec.stack, _stack_table()[spec.stack]["overlap"]
                         ["zero3_implementation"]["value"], overlap, sources)
    return Software(spec.stack, kernels, overlap, sources, spec.what_if)


def _stalled(overlap: dict, sources: dict, stall: str) -> None:
    """``overlap_grad_reduce`` off where the collective library moves a non-blocking
    collective only inside its own calls (``stall``, the reason): the gradient reductions
    issued during the backward move when the rank next waits for them, after it, as without
    the overlap (:data:`~ddlsim.config_system.NO_ASYNC_PROGRESS`). A ``true`` the user gave
    (not the stack's default) is warned about: it has no effect here."""
    if not overlap.get("overlap_grad_reduce"):
        return
    given = sources["overlap_grad_reduce"]
    if given.startswith(("parallel.", "system.software")):
        import warnings
        from .errors import DDLSimWarning
        name = given if given.endswith("overlap_grad_reduce") else f"{given}.overlap_grad_reduce"
        warnings.warn(f"{name} = true has no effect on this system: "
                      f"{stall}; the gradient reductions are timed after the backward (say "
                      "system.collectives.async_progress: true for a library with a progress "
                      "thread)", DDLSimWarning, stacklevel=2)
    overlap["overlap_grad_reduce"] = False
    sources["overlap_grad_reduce"] = f"off: {stall} (was true by {given})"


def stalled_grad_reduce(sw: "Software") -> str | None:
    """Why ``sw``'s ``overlap_grad_reduce`` was switched off by its collective library
    (:func:`_stalled`: no asynchronous progress), for the plan line's inactive overlaps; None
    when it was not."""
    source = sw.sources.get("overlap_grad_reduce", "")
    return source[len("off: "):] if source.startswith("off: ") else None


def _as_spec(spec: SoftwareSpec | str | None) -> SoftwareSpec:
    """``spec`` as a :class:`SoftwareSpec` (a stack's name, checked; None: the default)."""
    if spec is None:
        return SoftwareSpec()
    if isinstance(spec, str):
        if spec not in stacks():
            raise ConfigError(f"system.software = {unknown_stack(spec)}")
        return SoftwareSpec(stack=spec)
    return spec


def _apply_plan(parts: tuple[dict, ...], sources: dict, plan: Any) -> None:
    """Set in ``parts`` the plan's own options of the stack's fields (``plan.<field>`` when
    not None): the overlap options and ``cp_comm_type``."""
    if plan is None:
        return
    # a pydantic model's fields: no failed lookups for the stack fields it does not have —
    # this runs for every ``cfg.software``
    known = getattr(type(plan), "model_fields", None)
    for part in parts:
        for field in list(part):
            if known is not None and field not in known:
                continue
            value = getattr(plan, field, None)
            if value is not None:
                part[field], sources[field] = value, f"parallel.{field}"


#: what ``compile: true`` fuses, field -> why: torch.compile's Inductor fuses chains of
#: point-wise ops and reductions into one generated kernel each (Ansel et al., "PyTorch 2",
#: ASPLOS 2024, sec. 5: "horizontal and vertical fusion" of pointwise and reduction ops);
#: torchtitan compiles each transformer block whole (fullgraph=True) and, from 2025, the loss
COMPILE_FUSIONS = {
    "fused_layernorm": "the RMSNorm's pow, mean, rsqrt and mul in one kernel",
    "fused_bias_gelu": "SwiGLU's silu and mul in one kernel",
    "fused_squared_relu": "squared ReLU's relu and pow in one kernel",
    "fused_rope": "the rotary embedding's complex multiply in one kernel",
    "fused_bias_dropout_add": "each residual add fused with the op before it",
}


def _compiled(kernels: dict, sources: dict) -> None:
    """Switch on the fusions of :data:`COMPILE_FUSIONS` that ``compile: true`` brings, except
    those the config sets itself (a field given under ``system.software.kernels`` stays)."""
    for field, what in COMPILE_FUSIONS.items():
        if not sources[field].startswith("system.software"):
            kernels[field] = True
            sources[field] = f"compile: true ({sources['compile']}): Inductor fuses {what}"
    if "host_dispatch" in kernels and not sources["host_dispatch"].startswith("system.software"):
        kernels["host_dispatch"] = "compiled"
        sources["host_dispatch"] = (f"compile: true ({sources['compile']}): the compiled "
                                    "blocks launch Inductor's generated kernels")


def grad_dtype_bytes(rule: str, param_dtype: str) -> int:
    """Bytes per gradient element in the gradient buffers and their data-parallel reduction,
    under the stack's ``grad_reduce_dtype`` ``rule`` for parameters stored in ``param_dtype``
    (FP8 runs keep 16-bit parameters: pass the 16-bit dtype): ``param`` → the parameter's
    bytes, ``fp32`` → 4, ``fp32_if_bf16`` → 4 with bf16 parameters, else the parameter's."""
    own = DTYPE_BYTES[param_dtype]
    if rule == "fp32" or (rule == "fp32_if_bf16" and param_dtype == "bf16"):
        return max(own, 4)
    return own
