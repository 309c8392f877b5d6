"""benchmarks/proxies_check.py --host, benchmarks/device/proxies_16core.sh and
benchmarks/proxies_16core_compare.py: the seed's proxies on another machine, described by its
own cores (issue #30)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from benchscripts import BENCH  # puts benchmarks/ on sys.path: the scripts import their siblings
import proxies_table as table

_spec = importlib.util.spec_from_file_location("proxies_check", BENCH / "proxies_check.py")
pc = importlib.util.module_from_spec(_spec)
sys.modules["proxies_check"] = pc
_spec.loader.exec_module(pc)
import proxies_16core_compare as compare  # noqa: E402  (needs proxies_check imported first)


def test_host_ranks_run_only_on_a_host_with_the_cores():
    """dlrm runs at 16 ranks and cosmoflow at 8 only where the host has that many cores
    (``--host``); on kvm-2core their own rank counts stay as they were."""
    steady, cosmo = table.PROXIES["dlrm_steady"], table.PROXIES["cosmoflow"]
    assert not steady.runs_at(16)
    assert steady.runs_at(16, cores=16)
    assert not steady.runs_at(16, cores=8)
    assert steady.runs_at(8) and steady.runs_at(8, cores=16)
    assert cosmo.runs_at(8, cores=16) and not cosmo.runs_at(8)
    assert not table.PROXIES["gpt2_large"].runs_at(4, cores=16)


def test_host_is_one_device_per_core():
    """The host's system is kvm-2core's core with one device per usable core, named by them;
    past its cores the ranks share them as on kvm-2core."""
    import ddlsim
    sets = table.system_sets(16, cores=16)
    assert "system.devices_per_node=16" in sets and "system.name=host-16core" in sets
    system = ddlsim.load_config(table.CONFIGS / "dlrm.yaml",
                                overrides=table.PROXIES["dlrm_steady"].sets(16) + sets).system
    assert (system.name, system.devices_per_node) == ("host-16core", 16)
    assert "16 cores" in system.source
    assert table.system_sets(32, cores=16)[len(sets):]   # the shared-core overrides follow
    with pytest.raises(ValueError, match="cores=0"):
        table.system_sets(2, cores=0)


def test_host_predicts_the_ranks_kvm_2core_refuses():
    """A row of 8 ranks measured on a 16-core host is predicted there; the same row without
    ``host_cores`` (measured on kvm-2core) is refused, naming kvm-2core's 2 devices."""
    row = {"proxy": "dlrm_steady", "ranks": 8}
    kept, refused = pc.past_cores([{**row, "host_cores": 16}, row])
    assert kept == [{**row, "host_cores": 16}]
    assert [r for r, _ in refused] == [row]
    assert "'kvm-2core' has 1 nodes × 2 = 2 devices" in refused[0][1]


def test_host_ranks_are_not_time_shared():
    """16 ranks on a 16-core host are a core each; on kvm-2core each is 2/16 of one (a share
    of its memory bandwidth, sharedcores.shared_core_overrides)."""
    host = table.system_sets(16, cores=16)
    assert not any(s.startswith("system.device.") for s in host)
    assert "system.device.memory_bandwidth_Bps=1337500000.0" in table.system_sets(16)


def test_rows_of_two_hosts_are_refused():
    assert pc.host_cores([{"host_cores": 16}, {"host_cores": 16}]) == 16
    assert pc.host_cores([{"proxy": "dlrm"}]) is None
    with pytest.raises(ValueError, match="rows of different hosts"):
        pc.host_cores([{"host_cores": 16}, {}])


def test_compare_finds_rows_and_tabulates_them(tmp_path):
    """The compare script refuses a folder without rows and tabulates each row's launches,
    other tasks and both engines' errors."""
    with pytest.raises(FileNotFoundError, match="no rows.json"):
        compare.runs(tmp_path)
    (tmp_path / "proxies16" / "n2").mkdir(parents=True)
    row = {"proxy": "dlrm_steady", "ranks": 2, "measured_s": 4.0e-3,
           "runs_s": [4.0e-3, 4.5e-3, 3.9e-3], "background": [0.0, 0.1],
           "predicted_analytical_s": 3.6e-3, "error_analytical": -0.1,
           "predicted_des_s": 3.8e-3, "error_des": -0.05}
    (tmp_path / "proxies16" / "n2" / "rows.json").write_text(json.dumps([row]))
    assert compare.runs(tmp_path) == [tmp_path / "proxies16" / "n2"]
    assert compare.table([row]).splitlines()[-1] == (
        "| dlrm_steady | 2 | 4.00 ms (4.00, 4.50, 3.90) | 0.0 → 0.1 | 3.60 ms, -10.0 % | "
        "3.80 ms, -5.0 % |")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_device_script_parses():
    proc = subprocess.run(["bash", "-n", str(BENCH / "device" / "proxies_16core.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
