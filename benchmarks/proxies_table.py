"""The proxies ``proxies_check.py`` runs (:data:`PROXIES`: each program's printed line, the
rank counts it runs at and the ``--set`` values that resize its config to n ranks), the
system they run on at n ranks (:func:`system_sets`), and the calls each n-rank run issues
(:func:`comm_calls`, the sizes the calibration covers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CONFIGS", "SYSTEM", "Proxy", "PROXIES", "STEADY_DLRM", "system_sets",
           "host_name", "comm_calls"]

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "proxies"
#: the system preset of this machine (ddlsim/data/systems.yaml): one device per core
SYSTEM = "kvm-2core"
_SECONDS = r"= (\d+\.\d+) s"


def _dp(n: int, micro: int) -> list[str]:
    """``--set`` values of an n-rank data-parallel run of ``micro`` samples per rank."""
    return [f"parallel.data_parallel_size={n}", f"train.micro_batch_size={micro}",
            f"train.global_batch_size={micro * n}"]


def _pipe(n: int, micro: int) -> list[str]:
    """``--set`` values of the comm-only pipelines run as ``PROXY 4 2 2``: 4 layers on 2
    stages, 2 micro-batches of ``micro`` samples (the config's), n / 2 pipelines (the proxy's
    allreduce_group_size, gpt2_large.cpp:152-156)."""
    return ["model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=2",
            f"parallel.data_parallel_size={n // 2}", f"train.micro_batch_size={micro}",
            f"train.global_batch_size={2 * micro * (n // 2)}"]


def _cosmoflow(n: int) -> list[str]:
    """cosmoflow.cpp's 4 model shards (:129) and n / 4 data shards of batch 8 (:140-146)."""
    return _dp(n // 4, 8)


def _dlrm(n: int) -> list[str]:
    """dlrm.cpp takes no arguments: whatever the ranks, each sends EMB_ALL2ALL_SIZE floats per
    all-to-all (dlrm.cpp:28) of the 2048-sample batch (dlrm.cpp:125). ddlsim's all-to-all is
    one table per rank x 2048 x 128 x 4 B, so an n-rank run has n tables (1 MiB per call);
    the top MLP's input then has fewer pairwise interactions (2 ranks: 724,481 parameters
    against the proxy's fixed TOP_MLP_SIZE 728,065, -0.5 % of that all-reduce)."""
    table = "{rows: 80000, pooling: 5.05}"
    return [f"parallel.data_parallel_size={n}", f"train.micro_batch_size={2048 // n}",
            "train.global_batch_size=2048", f"model.tables=[{', '.join([table] * n)}]"]


@dataclass(frozen=True)
class Proxy:
    """One proxy program's output line, as run here.

    ``config`` is examples/proxies/CONFIG.yaml; ``source`` the program in the checkout;
    ``line`` a regex of the line it prints, the seconds per iteration its group 1; ``ranks``
    the rank counts run (those its command line allows, up to 4 ranks per core); ``sets``
    the ``--set`` values that resize the config to n ranks; ``cold``: the time printed is of
    one iteration with no warm-up (first touches and first calls in it), not the steady
    iteration ddlsim predicts; ``edits``: (text, replacement) pairs applied to a copy of the
    source in the work folder before it is built (each text must occur exactly once).
    """

    config: str
    source: str
    line: str
    ranks: tuple[int, ...]
    sets: Callable[[int], list[str]]
    args: tuple[str, ...] = field(default=())
    cold: bool = False
    edits: tuple[tuple[str, str], ...] = field(default=())
    host_ranks: tuple[int, ...] = field(default=())

    def runs_at(self, n: int, cores: int | None = None) -> bool:
        """Whether the proxy is run at n ranks: one of its ``ranks``, or, on a host described
        by its own cores (``proxies_check.py --host``, ``cores`` of them), one of its
        ``host_ranks`` (more rank counts its command line allows) up to those cores."""
        return n in self.ranks or (cores is not None and n <= cores and n in self.host_ranks)


#: dlrm.cpp timed over 20 iterations after 5 of warm-up instead of its one cold iteration
#: (``RUNS 1``, ``WARM_UP 0``, dlrm.cpp:22-23): the steady iteration ddlsim predicts. The
#: two ``#define`` lines are the only change; the per-iteration code is the proxy's own.
STEADY_DLRM = (("#define RUNS 1\n", "#define RUNS 20\n"),
               ("#define WARM_UP 0\n", "#define WARM_UP 5\n"))


#: The proxies run here, at rank counts up to 8 (4 ranks per core; more than the cores: the
#: ranks share them, proxies_check.py's step 3). Not run: gpt3 and gpt3_one_pipe_step (a
#: multiple of stages x MODEL_SHARDS = 4 ranks, gpt3.cpp:143, and their 4 x 96 = 384 ranks of
#: usleeps each iteration), gpt3_moe and its one-pipe-step variant (stages x NUM_MOE = 16,
#: gpt3_moe.cpp:156), resnet152_scal (256-2048 ranks only, resnet152_scal.cpp:97).
#: resnet50 (522 iterations of a 97.5 MiB all-reduce, and as many rings: ~3.5 minutes a
#: launch at 2 ranks under load 8),
#: gpt2_large and bert_large (at 4 ranks, 266 iterations a launch, each all-reducing ~420
#: or ~230 MB of a stage's gradients) run at 2 ranks only. ``host_ranks``: on a host of that
#: many cores or more (``--host``), also at 16 ranks (dlrm: any rank count, dlrm.cpp divides
#: its all-to-all by the ranks, :28 and :49), 8 and 16 (cosmoflow: multiples of its 4 model
#: shards, cosmoflow.cpp:129; resnet152: any rank count, its all-reduces span WORLD).
PROXIES: dict[str, Proxy] = {
    "dlrm": Proxy("dlrm", "proxies/dlrm.cpp", r"DLRM runtime per iteration " + _SECONDS,
                  (1, 2, 4, 8), _dlrm, cold=True,  # RUNS 1, WARM_UP 0 (dlrm.cpp:22-23)
                  host_ranks=(16,)),
    "dlrm_steady": Proxy("dlrm", "proxies/dlrm.cpp", r"DLRM runtime per iteration " + _SECONDS,
                         (1, 2, 4, 8), _dlrm, edits=STEADY_DLRM, host_ranks=(16,)),
    "resnet152": Proxy("resnet152", "proxies/resnet152.cpp",
                       r"runtime for each iteration " + _SECONDS, (1, 2, 4),
                       lambda n: _dp(n, 128), host_ranks=(8, 16)),
    "cosmoflow": Proxy("cosmoflow", "proxies/cosmoflow.cpp",
                       r"runtime for each iteration " + _SECONDS, (4,), _cosmoflow,
                       host_ranks=(8, 16)),
    "resnet50": Proxy("resnet50", "proxies/comm_only/resnet50.cpp",
                      r"\(allreduce\) runtime for each iteration " + _SECONDS, (2,),
                      lambda n: _dp(n, 32)),
    "resnet50_ring": Proxy("resnet50_ring", "proxies/comm_only/resnet50.cpp",
                           r"\(neighbors in ring\) runtime for each iteration " + _SECONDS,
                           (2,), lambda n: _dp(n, 32)),
    # comm_only/{gpt2,bert}_large.cpp ARGV "layers stages grad_acc_step" (main, :138-146):
    # 4 layers on 2 stages, 2 micro-batches; n / 2 pipelines
    "gpt2_large": Proxy("gpt2_large", "proxies/comm_only/gpt2_large.cpp",
                        r"parallelism runtime for each iteration " + _SECONDS, (2,),
                        lambda n: _pipe(n, 1), ("4", "2", "2")),
    "bert_large": Proxy("bert_large", "proxies/comm_only/bert_large.cpp",
                        r"parallelism runtime for each iteration " + _SECONDS, (2,),
                        lambda n: _pipe(n, 8), ("4", "2", "2")),
}


def host_name(cores: int) -> str:
    """The name of the host described by its own cores (``--host``): ``host-<cores>core``."""
    return f"host-{cores}core"


def system_sets(n: int = 1, cores: int | None = None) -> list[str]:
    """``--set`` values of :data:`SYSTEM` running n ranks: one device per core up to its
    cores, and past them each rank a time-shared share of a core
    (:func:`ddlsim.topologies.sharedcores.shared_core_overrides`).

    Parameters
    ----------
    n : int
        Ranks.
    cores : int, optional
        The usable cores of the host the proxies run on (``proxies_check.py --host``): the
        preset then has one device per one of them, named :func:`host_name`; each core is
        :data:`SYSTEM`'s (its figures matter where a proxy's time is not its usleeps: the
        one-rank copies at its memory bandwidth), the link is the calibration's
        (:func:`proxies_calib.link_sets`). None: the preset as it is (2 cores).
    """
    import ddlsim
    from ddlsim.topologies.sharedcores import shared_core_overrides
    base = [f"system.preset={SYSTEM}", "system.nodes=1"]
    if cores is not None:
        if cores < 1:
            raise ValueError(f"cores={cores}: the host's usable cores must be >= 1")
        base += [f"system.devices_per_node={cores}", f"system.name={host_name(cores)}",
                 f"system.source=\"{SYSTEM}'s core figures, one device per usable core of "
                 f"the host that ran the proxies ({cores} cores, os.sched_getaffinity)\""]
    system = ddlsim.load_config(CONFIGS / "dlrm.yaml", overrides=base + _dlrm(1)).system
    if n <= system.devices_per_node:
        return base
    return base + shared_core_overrides(system, n)


def _sizes(ops, out: set) -> None:
    """Add (calibrated op, bytes per call) of every communication op of ``ops`` to ``out``."""
    from ddlsim.workloads.trace import P2P, Collective, Loop
    for op in ops:
        p = op.payload
        if isinstance(p, Loop):
            _sizes(p.body, out)
        elif isinstance(p, P2P):
            out.add(("sendrecv", p.bytes))
        elif isinstance(p, Collective):
            out.add((str(p.op), p.bytes))


def comm_calls(proxy: Proxy, n: int, cores: int | None = None) -> set[tuple[str, float]]:
    """The distinct calls of the n-rank run's trace (the sizes ``ddlsim comm`` counts).

    Parameters
    ----------
    proxy : Proxy
        The proxy, its config resized by ``proxy.sets(n)`` on :data:`SYSTEM`.
    n : int
        Ranks.
    cores : int, optional
        The host's usable cores (:func:`system_sets`); None: :data:`SYSTEM` as it is.

    Returns
    -------
    set of (str, float)
        (op in ``ddlsim calibrate comm``'s names, bytes per call).
    """
    import ddlsim
    cfg = ddlsim.load_config(CONFIGS / f"{proxy.config}.yaml",
                             overrides=proxy.sets(n) + system_sets(n, cores))
    out: set = set()
    for cls in ddlsim.build_workload(cfg).classes:
        for block in cls.program.blocks.values():
            _sizes(block.ops, out)
    return out
