"""NCCL's tuning model on arrays of sizes
(:func:`ddlsim.simulator.collectives.nccl.model.nccl_seconds_array`, used by the search tier)
is the scalar :func:`nccl_time`, element for element: on a dense set
of sizes that straddles every threshold of the scalar code (the tree correction's powers of
two from 64 B to 512 MiB and one ulp either side, the ring plateau at ``64·nch·p`` bytes, the
NVLS and tree pipeline fills' chunk-size edges and one ulp below), for
every collective, algorithm and protocol, on one node, two nodes and many, with and without
SHARP, NVLink and PCIe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.collectives.nccl.model import (ALGORITHMS, NcclEnv, nccl_form,
                                                     nccl_seconds_array, nccl_time)
from ddlsim.simulator.collectives.nccl.tuning import PROTOCOLS

ENVS = [NcclEnv("ampere"), NcclEnv("hopper", sharp=True, nics_per_node=8),
        NcclEnv("volta", intra="pci", nvswitch=False, cpu="amd"), NcclEnv("blackwell"),
        # earlier releases' tables and rules (simulator/collectives/nccl/versions.py)
        NcclEnv("hopper", sharp=True, nics_per_node=8, version="2.21.5"),
        NcclEnv("ampere", cpu="amd", version="2.21.5")]
NETS = [(8, 8, 1, 300e9, math.inf), (16, 8, 2, 300e9, 25e9), (64, 8, 8, 300e9, 100e9),
        (12, 4, 3, 150e9, 12.5e9), (4, 1, 4, 300e9, 25e9)]


def _sizes() -> np.ndarray:
    powers = 64.0 * 2.0 ** np.arange(0, 24)
    edges = np.concatenate([powers, np.nextafter(powers, 0), np.nextafter(powers, np.inf)])
    plateau = 64.0 * np.array([1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]) * \
        np.array([[1], [12], [16], [64]]).ravel()[:, None]
    dense = np.geomspace(1.0, 2.0 ** 33, 500)
    return np.unique(np.concatenate([[0.0, 1.0, 63.0], edges, plateau.ravel(),
                                     np.nextafter(plateau.ravel(), 0), dense]))


@pytest.mark.parametrize("env", ENVS, ids=lambda e: f"{e.arch}-{e.version}")
def test_array_form_equals_the_scalar_time(env):
    sizes = _sizes()
    checked, plateaus, corrected, filled = 0, 0, 0, 0
    for p, g, nodes, bw_intra, bw_node in NETS:
        net = GroupNet(p, g, 1e-6, bw_intra, 5e-6, bw_node, nodes, nccl=env)
        for op, algos in ALGORITHMS.items():
            for algo in algos:
                for proto in PROTOCOLS:
                    form = nccl_form(op, algo, proto, net, env)
                    steps = np.array([] if form is None else form.fill_edges)
                    steps = steps[np.isfinite(steps)]  # the fill's edges and one ulp below
                    at = np.unique(np.concatenate([sizes, steps, np.nextafter(steps, 0)]))
                    want = np.array([nccl_time(op, algo, proto, n, net, env) for n in at])
                    if form is None:
                        assert np.all(np.isinf(want))
                        continue
                    got = nccl_seconds_array(at, form.latency_us, form.plateau_latency_us,
                                             form.plateau_div, form.algbw_GBps,
                                             proto if form.corrected else None,
                                             form.fill_edges, form.fill_us, form.fill_slope,
                                             form.channel_bytes, form.channels)
                    np.testing.assert_array_equal(got, want, err_msg=f"{op} {algo} {proto} {p}")
                    checked += 1
                    plateaus += math.isfinite(form.plateau_div)
                    corrected += form.corrected
                    filled += any(form.fill_us)
    assert checked > 40 and corrected > 0
    assert filled > 0  # the tree's (and on Hopper the NVLS) pipeline fill's steps too
    assert plateaus > 0  # the ring Simple all-reduce across nodes
