"""A node's point-to-point transfers at once share its memory (ddlsim.simulator.sharedcopies).

resnet50.cpp's ring loop at 2 ranks has both ranks send to each other at once
(benchmarks/proxies_exchange.py: past the cache each direction takes 1.5-1.6x the
ping-pong's time). With a profile that measured ``exchange`` (every rank's transfer at once)
beside ``sendrecv`` (the ping-pong), both engines time each of the ring's sends as
``max(link, (k / n_x) · t_x(b))``, k = 2 transfers of the class on the node, n_x = 2 in the
measurement; a pipeline's sends (one rank a class, k = 1) and any profile without
``exchange`` are timed as before.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ddlsim
import benchscripts  # noqa: F401  (puts benchmarks/ on the path for proxies_table)
from ddlsim.calibration.profile import CalibrationProfile
from ddlsim.calibration.schema import busbw_factor
from ddlsim.simulator.sharedcopies import SharedCopies, node_copies
from proxies_table import CONFIGS, PROXIES, system_sets

#: the ping-pong: 150 us + B / 13.8 GB/s (run6's resnet50_ring fit past 8 MiB, rounded)
SENDRECV = {"alpha_s": 150e-6, "beta_s_per_B": 1 / 13.8e9}
#: both directions at once: 200 us + B / 8.2 GB/s a transfer (proxies_exchange.py's 48 and
#: 96 MiB: 8.1 and 8.4 GB/s a direction)
EXCHANGE = {"alpha_s": 200e-6, "beta_s_per_B": 1 / 8.2e9}
LO, HI = 1 << 20, 1 << 28


def _entry(op: str, seg: dict) -> dict:
    return {"backend": "mpi", "op": op, "scope": "intra", "ranks": 2, "nodes": 1,
            "ranks_per_node": 2, "segments": [{"min_bytes": LO, "max_bytes": HI, **seg}]}


def _profile(exchange: bool) -> CalibrationProfile:
    comm = [_entry("sendrecv", SENDRECV)] + ([_entry("exchange", EXCHANGE)] if exchange else [])
    return CalibrationProfile.from_dict({"version": 1, "comm": comm})


def _config(name: str):
    proxy = PROXIES[name]
    link = [f"system.{part}.{key}={value!r}" for part in ("intra_node", "nic")
            for key, value in (("bandwidth_Bps", 1 / SENDRECV["beta_s_per_B"]),
                               ("latency_s", SENDRECV["alpha_s"]))]
    return ddlsim.load_config(CONFIGS / f"{proxy.config}.yaml",
                              overrides=proxy.sets(2) + system_sets(2) + link)


def _predict(cfg, profile) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the pipelines' first touch: not what is tested
        return {e: ddlsim.predict(cfg, e, calibration=profile, backend="mpi",
                                  check_fit=False).iteration_time_s
                for e in ("analytical", "des")}


def _ring_messages(cfg) -> list[float]:
    w = ddlsim.build_workload(cfg)
    ops = w.classes[0].program.blocks["B.sync"].ops
    return [op.payload.bytes for op in ops if getattr(op.payload, "kind", "") == "send"]


def _t(seg: dict, b: float) -> float:
    return seg["alpha_s"] + seg["beta_s_per_B"] * b


def test_the_ring_at_two_ranks_is_timed_by_the_exchange_in_both_engines():
    cfg = _config("resnet50_ring")
    sizes = _ring_messages(cfg)
    assert len(sizes) == 6 and all(LO <= b <= HI for b in sizes)
    before = _predict(cfg, _profile(exchange=False))
    after = _predict(cfg, _profile(exchange=True))
    # by hand: each message on the link alone, then at the exchange's time (2 of 2 at once)
    assert before["analytical"] == pytest.approx(sum(_t(SENDRECV, b) for b in sizes), rel=1e-9)
    assert after["analytical"] == pytest.approx(sum(_t(EXCHANGE, b) for b in sizes), rel=1e-9)
    assert after["des"] == pytest.approx(after["analytical"], rel=1e-9)
    assert before["des"] == pytest.approx(before["analytical"], rel=1e-9)


@pytest.mark.parametrize("name", ["gpt2_large", "bert_large"])
def test_a_pipelines_sends_one_at_a_time_are_not_slowed(name):
    cfg = _config(name)
    before, after = _predict(cfg, _profile(False)), _predict(cfg, _profile(True))
    assert after == pytest.approx(before, rel=1e-12)


def test_transfers_counted_on_the_most_crowded_node():
    node = np.array([0, 0, 0, 0, 1, 1])
    assert node_copies(node, np.array([0, 1, 2, 3]), np.array([1, 0, 3, 2])) == 4
    assert node_copies(node, np.array([0, 4, 5]), np.array([1, 5, 4])) == 2
    assert node_copies(node, np.array([0, 1]), np.array([4, 5])) == 0


def test_the_floor_scales_with_the_transfers_at_once_and_stays_in_the_measured_range():
    copies = SharedCopies(_profile(True), "mpi")
    b = 16 << 20
    assert copies.floor_s(b, 2) == pytest.approx(_t(EXCHANGE, b), rel=1e-12)
    assert copies.floor_s(b, 1) == pytest.approx(_t(EXCHANGE, b) / 2, rel=1e-12)
    assert copies.floor_s(b, 4) == pytest.approx(_t(EXCHANGE, b) * 2, rel=1e-12)
    assert copies.floor_s(HI * 2, 2) is None and copies.floor_s(b, 0) is None
    assert not SharedCopies(_profile(False), "mpi") and not SharedCopies(None, None)
    assert not SharedCopies(_profile(True), "nccl")


def test_an_exchange_moves_each_ranks_message_once():
    assert busbw_factor("exchange", 2) == busbw_factor("exchange", 8) == 1.0
