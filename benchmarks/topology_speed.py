"""Time building large topologies and routing random pairs on them (not a unit test).

    python benchmarks/topology_speed.py

Target: a 1,024-node DGX-A100 fat tree (8,192 GPUs) builds and routes 10,000 random pairs in
a few seconds at most. Numbers depend on the machine; the routes themselves are deterministic.

The last row is the 100k-GPU scale of issue 27: 16,384 DGX H100 nodes (131,072 GPUs, a
three-level fat tree, 1.3·10^6 directed links), built in a fresh process so that its peak
memory is its own, timed by CPU and wall clock, without the networkx graph or its bisection
(which the engines never build).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
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


#: issue 27's cluster: GPT-3 175B on 131,072 H100s runs on it
SCALE = {"preset": "dgx-h100", "nodes": 16384}


def scale_one(pairs: int = 10_000, seed: int = 0) -> None:
    """Build :data:`SCALE` and route ``pairs`` random pairs (and their rail-0 routes) in this
    process; print CPU and wall seconds and the peak memory as JSON."""
    c0, t0 = time.process_time(), time.perf_counter()
    topo = build_topology(SCALE)
    build = (time.process_time() - c0, time.perf_counter() - t0)
    ends = np.random.default_rng(seed).integers(0, topo.num_devices, size=(pairs, 2)).tolist()
    c1 = time.process_time()
    for a, b in ends:
        topo.route(a, b)
        topo.route_rail(a, b, 0)
    print(json.dumps({"build_cpu_s": build[0], "build_wall_s": build[1],
                      "route_cpu_s": time.process_time() - c1, "links": len(topo.edge_kind),
                      "devices": topo.num_devices,
                      "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def scale(pairs: int = 10_000) -> None:
    out = subprocess.run([sys.executable, __file__, "--scale-one"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(f"dgx-h100 × 16,384, fat tree: {r['devices']:,} devices, {r['links']:,} directed links, "
          f"built in {r['build_cpu_s']:.2f} s CPU ({r['build_wall_s']:.2f} s wall); "
          f"{pairs:,} routes and rail routes {r['route_cpu_s']:.2f} s CPU; peak {r['peak_MB']:.0f} MB")


if __name__ == "__main__":
    if "--scale-one" in sys.argv:
        scale_one()
    else:
        main()
        scale()
