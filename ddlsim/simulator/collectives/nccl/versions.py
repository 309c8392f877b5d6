"""NCCL's tuning model per release: the tables and rules of ``src/graph/tuning.cc`` (and the
two topology constants ddlsim reads from ``topo.h`` and ``search.cc``) at each tagged version
ddlsim tabulates, keyed by the version string a user types (``system.collectives.nccl_version``).

NCCL re-tunes its model between releases: NCCL 2.21.5 estimated a tree/Simple hop at 28 µs
with no base latency, 2.23 at 4 µs on NVLink and 14 µs on the network over an 8.4 µs base; an
NVLS-tree network hop is 14 µs up to 2.28 and 20.9 µs from 2.29; the ring's network steps of an
all-reduce are ``2·nodes`` up to 2.22 and ``2·(nodes − 1)`` from 2.23; NVLS bandwidth is
``min(bwIntra, bwInter) × 5/6`` before 2.28 and an NVLS-efficiency model after. A measured run
is best compared with the model of the version it ran.

Each :class:`NcclTables` is re-typed from NVIDIA/nccl at its tag (read, not copied), with the
lines beside each table. ``treeCorrectionFactor`` is the same in every tabulated version (its
first 23 entries: v2.21.5-1 tuning.cc lines 412–416, v2.26.2-1 lines 524–528, v2.30.7-1 lines
623–627), so it stays in :mod:`.tuning`. Not per version (read at v2.26.2-1 for all): the
chunk sizes of ``calcCollChunking`` (:mod:`.measured`, :mod:`.tree`) and the channel rule
(:mod:`.channels`), and the fitted constants of :mod:`.measured` and :mod:`.hops`.

The release drives NCCL's estimate, so both what NCCL chooses and the time ddlsim takes from
that estimate. Where an older release's estimate held a stand-in for what ddlsim models apart,
the two add up: NCCL 2.21.5's tree/Simple hop of 28 µs was "the latency of a 256kB chunk"
(v2.16.5-1 tuning.cc line 62), which :mod:`.tree`'s pipeline fill also counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ....errors import ConfigError
from . import tuning as T

__all__ = ["NcclTables", "NCCL_VERSIONS", "DEFAULT_VERSION", "register_version", "tables",
           "version_names"]


@dataclass(frozen=True)
class NcclTables:
    """What one NCCL release's tuning model reads (units as NCCL's: µs and GB/s).

    Parameters
    ----------
    version : the release, e.g. ``"2.21.5"``.
    tag : the NVIDIA/nccl tag the tables were read at.
    base_latency_us, hw_latency_us : ``baseLat`` and ``hwLat`` (as :mod:`.tuning`'s).
    ll_max_bw, per_ch_max_bw : ``llMaxBws`` and the per-channel caps (as :mod:`.tuning`'s; no
        ``nvls_tree`` cap before ``perChMaxNVLSTreeBws``, 2.28).
    nvls_efficiency : ``nvlsEfficiency`` per class, or None where the release has none (before
        2.28: NVLS bus bandwidth ``min(bwIntra, bwInter)``, NVLS-tree ``min(bwIntra, bwInter
        or bwInter/2 from 3 nodes)``, then × 5/6 for the algorithm bandwidth).
    net_overhead_us : ``getNetOverhead`` by CPU vendor.
    nvlink_efficiency, top_speed_GBps : topo.h NVLink bandwidth over the line rate, search.cc
        first speeds (as :mod:`.tuning`'s).
    archs : the compute-capability classes the release has rows for.
    inter_steps_per_node : True where a ring all-reduce's network steps are ``2·nodes``
        (before 2.23), False where ``2·(nodes − 1)``.
    ppn1_tree_net : True where one GPU a node takes the tree's network latency (from 2.23).
    ring_ll128_ppn1_factor : the ring LL128 bandwidth factor with under 2 GPUs a node
        (0.7 before 2.23; 0.92, as with more, after).
    converts_all_gather : True where every algorithm but CollNet-direct converts its
        all-gather and reduce-scatter bus bandwidth to an algorithm bandwidth (before 2.23),
        False where only the ring does.
    """

    version: str
    tag: str
    base_latency_us: Mapping
    hw_latency_us: Mapping
    ll_max_bw: Mapping
    per_ch_max_bw: Mapping
    nvls_efficiency: Mapping | None
    net_overhead_us: Mapping
    nvlink_efficiency: Mapping
    top_speed_GBps: Mapping
    archs: tuple[str, ...]
    inter_steps_per_node: bool
    ppn1_tree_net: bool
    ring_ll128_ppn1_factor: float
    converts_all_gather: bool


#: version string → its tables (:func:`register_version` fills it)
NCCL_VERSIONS: dict[str, NcclTables] = {}

#: the release ddlsim's model reads unless told otherwise (tuning.py's tables)
DEFAULT_VERSION = "2.30.7"


def register_version(version: str, tag: str, **fields) -> NcclTables:
    """Register the tables of NCCL ``version`` (read at NVIDIA/nccl ``tag``); the mappings are
    read, never written (plain dicts: the tuning model looks them up in its inner loops).

    Parameters
    ----------
    version : str
        The release, e.g. ``"2.21.5"`` (the key users give as
        ``system.collectives.nccl_version``).
    tag : str
        The NVIDIA/nccl tag the tables were read at.
    **fields
        The other fields of :class:`NcclTables` (latencies in µs, bandwidths in GB/s, as
        NCCL's own tables).

    Returns
    -------
    NcclTables
        The registered tables.
    """
    NCCL_VERSIONS[version] = NcclTables(version, tag, **fields)
    return NCCL_VERSIONS[version]


def version_names() -> tuple[str, ...]:
    """The tabulated NCCL versions, oldest first."""
    return tuple(sorted(NCCL_VERSIONS, key=lambda v: tuple(int(x) for x in v.split("."))))


def tables(version: str, arch: str | None = None) -> NcclTables:
    """The tables of NCCL ``version``, checked to have rows for ``arch``.

    Parameters
    ----------
    version : str
        A tabulated release (a key of :data:`NCCL_VERSIONS`).
    arch : str, optional
        A compute-capability class (``volta``, ``ampere``, ``hopper``, ``blackwell``); None:
        not checked.

    Returns
    -------
    NcclTables
        The release's tables.

    Raises
    ------
    ConfigError
        Naming ``system.collectives.nccl_version`` where ``version`` is not tabulated, or
        ``system.collectives.gpu_arch`` where the release has no row for ``arch``.
    """
    got = NCCL_VERSIONS.get(version)
    if got is None:
        raise ConfigError(f"system.collectives.nccl_version = {version!r} is not a tabulated "
                          f"NCCL release; allowed: {', '.join(version_names())}")
    if arch is not None and arch not in got.archs:
        raise ConfigError(f"system.collectives.nccl_version = {version!r} has no tuning rows "
                          f"for gpu_arch {arch!r} (NCCL {version} knows "
                          f"{', '.join(got.archs)}); choose a later nccl_version")
    return got


# NCCL 2.30.7 (the default): tuning.py's tables, read at NVIDIA/nccl 5067397c (version.mk 2.30.7)
register_version(
    "2.30.7", "v2.30.7-1", base_latency_us=T.BASE_LATENCY_US, hw_latency_us=T.HW_LATENCY_US,
    ll_max_bw=T.LL_MAX_BW, per_ch_max_bw=T.PER_CH_MAX_BW, nvls_efficiency=T.NVLS_EFFICIENCY,
    net_overhead_us=T.NET_OVERHEAD_US, nvlink_efficiency=T.NVLINK_EFFICIENCY,
    top_speed_GBps=T.TOP_SPEED_GBPS, archs=T.ARCHS, inter_steps_per_node=False,
    ppn1_tree_net=True, ring_ll128_ppn1_factor=0.92, converts_all_gather=False)

# NCCL 2.26.2 (NVIDIA/nccl-tests#309's hosts), tag v2.26.2-1
register_version(
    "2.26.2", "v2.26.2-1",
    # tuning.cc lines 120–123 (baseLat): as 2.30.7's
    base_latency_us=T.BASE_LATENCY_US,
    # tuning.cc lines 129–142 (hwLat): as 2.30.7's but the NVLS-tree network hop, 14 µs
    hw_latency_us={
        "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
                   "collnet": (0.0, 0.0, 3.7), "nvls": (0.0, 0.0, 25.0),
                   "nvls_tree": (0.0, 0.0, 25.0)},
        "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet": (0.0, 0.0, 3.7),
                "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
        "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
                "collnet": (0.0, 0.0, 31.0), "nvls": (0.0, 0.0, 18.0),
                "nvls_tree": (0.0, 0.0, 14.0)}},
    # tuning.cc lines 151–156 (llMaxBws): as 2.30.7's
    ll_max_bw=T.LL_MAX_BW,
    # tuning.cc lines 158–175: Blackwell rows twice Hopper's; no perChMaxNVLSTreeBws
    per_ch_max_bw={
        "ring_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                       "hopper": (36.7, 36.7, 36.7), "blackwell": (73.4, 73.4, 73.4)},
        "tree_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                       "hopper": (36.7, 36.7, 29.0), "blackwell": (73.4, 73.4, 58.0)},
        "tree": {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                 "hopper": (38.7, 41.4, 36.0), "blackwell": (77.4, 82.8, 72.0)}},
    # tuning.cc lines 250–253 and 293: NVLS bus bandwidth before nvlsEfficiency
    nvls_efficiency=None,
    # tuning.cc lines 190–195 (getNetOverhead)
    net_overhead_us={"intel": 1.0, "amd": 2.0},
    # topo.h lines 15–19: SM100_NVLINK_BW 40.0 (2.30.7: 40.1)
    nvlink_efficiency={"volta": 20.0 / 25.0, "ampere": 20.0 / 25.0, "hopper": 20.6 / 25.0,
                       "blackwell": 40.0 / 50.0},
    # search.cc lines 918–924: sm100SpeedArrayInter[0] 48 (2.30.7: 96)
    top_speed_GBps={"volta": (40.0, 48.0), "ampere": (40.0, 48.0), "hopper": (60.0, 48.0),
                    "blackwell": (90.0, 48.0)},
    archs=("volta", "ampere", "hopper", "blackwell"),
    # tuning.cc line 323 (2·(nNodes − 1)), line 301 (ppn == 1: tree's NET row), line 257
    # (0.92), line 290 (only the ring converts an all-gather's bandwidth)
    inter_steps_per_node=False, ppn1_tree_net=True, ring_ll128_ppn1_factor=0.92,
    converts_all_gather=False)

# NCCL 2.21.5 (NVIDIA/nccl#1244's hosts), tag v2.21.5-1
register_version(
    "2.21.5", "v2.21.5-1",
    # tuning.cc lines 56–59 (baseLat): tree/Simple 0
    base_latency_us={"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4),
                     "collnet": (0.0, 0.0, 0.0), "nvls": (0.0, 0.0, 0.0),
                     "nvls_tree": (0.0, 0.0, 0.0)},
    # tuning.cc lines 65–78 (hwLat): tree/Simple 28 µs on every link, NVLS-tree network 14 µs
    hw_latency_us={
        "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4),
                   "collnet": (0.0, 0.0, 3.7), "nvls": (0.0, 0.0, 25.0),
                   "nvls_tree": (0.0, 0.0, 25.0)},
        "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7), "collnet": (0.0, 0.0, 3.7),
                "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
        "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0),
                "collnet": (0.0, 0.0, 31.0), "nvls": (0.0, 0.0, 18.0),
                "nvls_tree": (0.0, 0.0, 14.0)}},
    # tuning.cc lines 86–90 (llMaxBws; multi-node rows by CPU as :mod:`.tuning`'s)
    ll_max_bw={"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
               "hopper": (141.0, 45.0, 35.0), "intel": (39.0, 39.0, 20.4),
               "amd": (87.7, 22.5, 19.0)},
    # tuning.cc lines 92–106; no Blackwell rows, no perChMaxNVLSTreeBws
    per_ch_max_bw={
        "ring_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                       "hopper": (36.7, 36.7, 36.7)},
        "tree_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                       "hopper": (36.7, 36.7, 29.0)},
        "tree": {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                 "hopper": (38.7, 41.4, 36.0)}},
    # tuning.cc lines 174–177 and 216: NVLS bus bandwidth before nvlsEfficiency
    nvls_efficiency=None,
    # tuning.cc lines 111–118 (getNetOverhead)
    net_overhead_us={"intel": 1.0, "amd": 2.0},
    # topo.h lines 15–17
    nvlink_efficiency={"volta": 20.0 / 25.0, "ampere": 20.0 / 25.0, "hopper": 20.6 / 25.0},
    # search.cc lines 850–856 (speedArrayIntra/Inter[0], sm90SpeedArray*[0])
    top_speed_GBps={"volta": (40.0, 48.0), "ampere": (40.0, 48.0), "hopper": (60.0, 48.0)},
    archs=("volta", "ampere", "hopper"),
    # tuning.cc line 161 (nInterSteps 2·nNodes), line 227 (no ppn == 1 rule), line 181 (0.7),
    # line 213 (all but CollNet-direct convert an all-gather's bandwidth)
    inter_steps_per_node=True, ppn1_tree_net=False, ring_ll128_ppn1_factor=0.7,
    converts_all_gather=True)
