"""``ddlsim sweep --dask`` / ``ddlsim.sweep(dask=...)``: the combinations run as Dask tasks and
the frame is the serial one, bit for bit; Dask's failures are one-paragraph errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pandas as pd
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim import distributed as ddist
from ddlsim.cli import app
from ddlsim.distributed import DistributedError

runner = CliRunner()
WIKI = "examples/wiki-gpt2-9ranks-reduce_scatter.yaml"
NIC = "system.nic.bandwidth_Bps"
TP = "parallel.tensor_model_parallel_size"
# 3 × 2: TP 2 needs 18 ranks on a 10-device system, so half the rows are invalid ones
RANGES = {NIC: ["1 Gb/s", "10 Gb/s", "100 Gb/s"], TP: [1, 2]}
CLI_RANGES = ["--set-range", f"{NIC}=1,10,100 Gb/s", "--set-range", f"{TP}=1,2"]
needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="dask distributed is not installed (pip install "
                                       "'ddlsim[dask]')")


@pytest.fixture(scope="module")
def serial():
    return ddlsim.sweep(WIKI, RANGES)


@pytest.fixture(scope="module")
def threads_client():
    """A cluster inside this process, so a monkeypatch reaches its tasks."""
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1,
                            dashboard_address=None) as client:
        yield client


def _one_paragraph_error(r, *fragments):
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error: "), text
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.output
    for fragment in fragments:
        assert fragment in text, text
    return text


@needs_dask
def test_local_cluster_of_two_processes_gives_the_serial_frame(serial):
    frame = ddlsim.sweep(WIKI, RANGES, dask="local", dask_workers=2)
    assert (~serial["valid"]).sum() == 3  # the invalid rows travel too
    pd.testing.assert_frame_equal(frame, serial, check_exact=True)


@needs_dask
def test_cli_dask_local_writes_the_same_csv(tmp_path):
    for name, extra in (("serial.csv", []), ("dask.csv", ["--dask", "local"])):
        r = runner.invoke(app, ["sweep", WIKI, *CLI_RANGES, "-o", str(tmp_path / name), *extra])
        assert r.exit_code == 0, r.output
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "serial.csv").read_bytes()


@needs_dask
def test_a_client_is_used_as_given_and_progress_follows_the_tasks(serial, threads_client):
    calls = []
    frame = ddlsim.sweep(WIKI, RANGES, dask=threads_client, progress=lambda *a: calls.append(a))
    pd.testing.assert_frame_equal(frame, serial, check_exact=True)
    assert calls == [(i, 6) for i in range(1, 7)]  # one task per combination of 6
    assert threads_client.status == "running"  # not closed: the caller owns it


@needs_dask
def test_an_error_inside_a_task_names_the_combination(monkeypatch, threads_client):
    import ddlsim.api

    real = ddlsim.api.predict

    def predict(cfg, *args, **kwargs):
        if cfg.system.nic.bandwidth_Bps == 1.25e9:  # 10 Gb/s
            raise RuntimeError("boom")
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(ddlsim.api, "predict", predict)
    with pytest.raises(DistributedError, match=r"failed on the combination "
                       rf"{NIC}=\"10 Gb/s\", {TP}=1: RuntimeError: boom") as info:
        ddlsim.sweep(WIKI, RANGES, dask=threads_client)
    assert isinstance(info.value.__cause__, RuntimeError)


@needs_dask
def test_an_unreachable_scheduler_fails_within_the_timeout(monkeypatch):
    monkeypatch.setattr(ddist, "CONNECT_TIMEOUT_S", 1.0)
    start = time.monotonic()
    r = runner.invoke(app, ["sweep", WIKI, *CLI_RANGES, "--dask", "tcp://127.0.0.1:1"])
    assert time.monotonic() - start < 5
    _one_paragraph_error(r, "--dask 'tcp://127.0.0.1:1'", "no Dask scheduler could be reached",
                         "connection timeout 1 s")


def test_missing_dask_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed → ImportError
    r = runner.invoke(app, ["sweep", WIKI, *CLI_RANGES, "--dask", "local"])
    _one_paragraph_error(r, "pip install 'ddlsim[dask]'")


def test_dask_workers_needs_dask_local():
    r = runner.invoke(app, ["sweep", WIKI, *CLI_RANGES, "--dask-workers", "3"])
    _one_paragraph_error(r, "--dask-workers applies only with --dask local")
    with pytest.raises(ddlsim.errors.ConfigError, match="dask_workers"):
        ddlsim.sweep(WIKI, RANGES, dask_workers=3)


def test_a_dask_value_that_is_no_cluster_is_refused():
    with pytest.raises(DistributedError, match="dask = 4 is not allowed; give None, 'local'"):
        ddlsim.sweep(WIKI, RANGES, dask=4)


def test_the_cli_does_not_import_dask_without_dask():
    code = "import sys, ddlsim.cli; print('distributed' in sys.modules or 'dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@needs_dask
def test_two_sweeps_on_one_client_do_not_share_scattered_data(threads_client):
    """Scattered inputs get unique keys: with content-hashed keys the second sweep's tasks
    lost their inputs when the first sweep released the identical keys ("lost dependencies")."""
    first = ddlsim.sweep(WIKI, RANGES, dask=threads_client)
    for _ in range(3):
        pd.testing.assert_frame_equal(ddlsim.sweep(WIKI, RANGES, dask=threads_client), first,
                                      check_exact=True)
