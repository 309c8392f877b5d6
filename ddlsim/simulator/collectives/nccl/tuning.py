"""The constants of NCCL's tuning model, each beside the line of NCCL it comes from.

Source: NVIDIA/nccl at commit 5067397c (``makefiles/version.mk``: NCCL 2.30.7),
``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``, ``ncclTopoTuneModel``,
``treeCorrectionFactor``, ``ncclTopoGetAlgoTime``), ``src/graph/topo.h`` (NVLink bandwidths) and
``src/graph/search.cc`` (per-channel speeds the topology search tries first). Read, not copied:
the tables are re-typed as Python mappings keyed by name. Latencies are in microseconds and
bandwidths in GB/s (10⁹ B/s) as in NCCL; :mod:`.model` converts them at its edge. These are
the tables of the default release (``system.collectives.nccl_version`` 2.30.7); other releases'
are in :mod:`.versions`.
"""

from __future__ import annotations

__all__ = ["ARCHS", "PROTOCOLS", "BASE_LATENCY_US", "HW_LATENCY_US", "LL_MAX_BW", "PER_CH_MAX_BW",
           "NVLS_EFFICIENCY", "NVLINK_EFFICIENCY", "TOP_SPEED_GBPS", "TREE_CORRECTION",
           "NET_OVERHEAD_US"]

#: compute-capability classes NCCL indexes its tables by (tuning.cc, ``compCapIndex``)
ARCHS = ("volta", "ampere", "hopper", "blackwell")
PROTOCOLS = ("LL", "LL128", "Simple")

#: tuning.cc ``baseLatencies`` (µs), per algorithm, per protocol (LL, LL128, Simple)
BASE_LATENCY_US = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet": (0.0, 0.0, 0.0), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
}

#: tuning.cc ``hwLatencies`` (µs) per link class (NVLINK, PCI, NET), algorithm, protocol;
#: ``collnet`` is NCCL's CollNetDirect row
HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet": (0.0, 0.0, 3.7), "nvls": (0.0, 0.0, 25.0),
               "nvls_tree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
            "collnet": (0.0, 0.0, 3.7), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
            "collnet": (0.0, 0.0, 31.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 20.9)},
}

#: tuning.cc ``getNetOverhead`` (lines 228–233, µs): the least a ring step of an inter-node
#: ring takes (``intraLat = max(intraLat, netOverhead)``, × 3 for Simple), by CPU vendor
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}

#: tuning.cc ``llMaxBws`` (GB/s): rows Volta/Ampere/Hopper/Blackwell for one node, and for
#: several nodes rows 0 (Intel CPU) and 1 (AMD CPU); columns 1, 2, ≥ 3 nodes
LL_MAX_BW = {
    "volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0),
    "intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0),
}

#: tuning.cc per-channel caps (GB/s) ``perChMaxRingLL128Bws``, ``perChMaxTreeLL128Bws``,
#: ``perChMaxTreeBws``; columns 1, 2, ≥ 3 nodes
PER_CH_MAX_BW = {
    "ring_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                   "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)},
    "tree_ll128": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                   "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)},
    "tree": {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
             "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)},
    "nvls_tree": {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),  # perChMaxNVLSTreeBws
                  "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)},
}

#: tuning.cc ``nvlsEfficiency`` (NVLS unavailable before Hopper)
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}

#: the NVLink bandwidth NCCL's topology assumes per link (topo.h ``SM70_NVLINK_BW`` 20.0,
#: ``SM80_NVLINK_BW`` 20.0, ``SM90_NVLINK_BW`` 20.6, ``SM100_NVLINK_BW`` 40.1 GB/s) over the
#: signalling rate per link and direction (25 GB/s for NVLink 2, 3 and 4, 50 GB/s for NVLink 5:
#: NVIDIA V100, A100, H100 and B200 datasheets): the share of a link NCCL expects to fill
NVLINK_EFFICIENCY = {"volta": 20.0 / 25.0, "ampere": 20.0 / 25.0, "hopper": 20.6 / 25.0,
                     "blackwell": 40.1 / 50.0}

#: search.cc: the first per-channel speed the search tries (GB/s), intra / inter
#: (``speedArrayIntra[0]``/``speedArrayInter[0]``, ``sm90SpeedArray*``, ``sm100SpeedArray*``)
TOP_SPEED_GBPS = {"volta": (40.0, 48.0), "ampere": (40.0, 48.0), "hopper": (60.0, 48.0),
                  "blackwell": (90.0, 96.0)}

#: tuning.cc ``treeCorrectionFactor`` per protocol, index log2(bytes / 64), 64 B … 256 MiB
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
