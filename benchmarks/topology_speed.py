"""Time building large topologies and routing random pairs on them (not a unit test).

    python benchmarks/topology_speed.py

Target: a 1,024-node DGX-A100 fat tree (8,192 GPUs) builds and routes 10,000 random pairs in
a few seconds at most. Numbers depend on the machine; the routes themselves are deterministic.
"""

from __future__ import annotations

import time

import numpy as np

from ddlsim.topologies import bisection_bandwidth, build_topology

CASES = {
    "dgx-a100 × 1024, fat tree": {"preset": "dgx-a100", "nodes": 1024},
    "dgx-a100 × 1024, rail-optimised": {"preset": "dgx-a100", "nodes": 1024,
                                        "network": {"topology": "rail_optimized"}},
    "dgx-h100 × 1024, fat tree r=2": {"preset": "dgx-h100", "nodes": 1024,
                                      "network": {"oversubscription": 2}},
    "dgx-a100 × 1024, 3-D torus 16×8×8": {"preset": "dgx-a100", "nodes": 1024,
                                         "network": {"topology": "torus",
                                                     "torus_dims": [16, 8, 8]}},
    "dgx-a100 × 1024, dragonfly": {"preset": "dgx-a100", "nodes": 1024,
                                   "network": {"topology": "dragonfly"}},
}


def _time(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(pairs: int = 10_000, seed: int = 0) -> None:
    print(f"{'topology':36} {'vertices':>8} {'edges':>7} {'build':>7} "
          f"{'route ×' + str(pairs):>12} {'cached':>7} {'bisection':>10}")
    for name, spec in CASES.items():
        topo, build_s = _time(lambda: build_topology(spec))
        rng = np.random.default_rng(seed)
        ends = rng.integers(0, topo.num_devices, size=(pairs, 2)).tolist()
        _, route_s = _time(lambda: [topo.route(a, b) for a, b in ends])
        _, cached_s = _time(lambda: [topo.route(a, b) for a, b in ends])
        (value, _), cut_s = _time(lambda: bisection_bandwidth(topo))
        print(f"{name:36} {topo.graph.number_of_nodes():8d} {len(topo.edges):7d} "
              f"{build_s:6.2f}s {route_s:11.2f}s {cached_s:6.3f}s {cut_s:9.2f}s"
              f"   ({value / 1e12:.1f} TB/s)")


if __name__ == "__main__":
    main()
