"""The seed's C++ proxies as measured on this machine on 2026-11-29 (benchmarks/data/
proxies_2026-11-29/run*: the rows ``proxies_check.py --json`` wrote and the profiles that run
calibrated at each rank count), predicted again by this ddlsim: both engines price a
calibrated collective alike (docs/engines.md), so they agree on every recorded run; the DES
differs only where communication of two families runs at once and shares the node's link
(dlrm's all-to-all beside its all-reduces, cosmoflow's halo exchanges and all-gathers beside
its all-reduces), which the analytical engine does not see; sharing only slows.
"""

from __future__ import annotations

import json
import warnings

import pytest

import ddlsim
from benchscripts import BENCH, load_script
from proxies_calib import link_sets
from proxies_table import CONFIGS, PROXIES, system_sets

row_profile = load_script("proxies_check").row_profile

DATA = BENCH / "data" / "proxies_2026-11-29"
ROWS = [(run, r) for run in sorted(DATA.glob("run*"))
        for r in json.loads((run / "rows.json").read_text())]
#: proxies whose communication of two families overlaps: dlrm.cpp:59-71 (the Iallreduces
#: beside the backward all-to-all), cosmoflow.cpp:95-122 (the Iallreduces beside the halo
#: exchanges and reduce-scatters); the DES shares the link between them
SHARED = {"dlrm", "dlrm_steady", "cosmoflow"}


def _both(run, row: dict) -> dict[str, float]:
    proxy, n = PROXIES[row["proxy"]], row["ranks"]
    profile = row_profile(run, row)
    sets = proxy.sets(n) + system_sets(n) + (link_sets(proxy, n, profile) if profile else [])
    cfg = ddlsim.load_config(CONFIGS / f"{proxy.config}.yaml", overrides=sets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sizes outside a profile's range: the preset's model
        return {e: ddlsim.predict(cfg, e, calibration=profile,
                                  backend="mpi" if profile else None,
                                  check_fit=False).iteration_time_s
                for e in ("analytical", "des")}


@pytest.mark.parametrize("run, row", ROWS,
                         ids=[f"{run.name}-{r['proxy']}-{r['ranks']}" for run, r in ROWS])
def test_both_engines_price_the_recorded_runs_alike(run, row):
    got = _both(run, row)
    if row["proxy"] in SHARED:
        assert got["des"] >= got["analytical"] * (1 - 1e-9)  # sharing only slows
        assert got["des"] == pytest.approx(got["analytical"], rel=0.25)
    else:
        assert got["des"] == pytest.approx(got["analytical"], rel=1e-9)
