"""Fuzz: damaged real results files and profiles raise nothing but ddlsim's own errors.

Every sample file of data/ (and ddlsim CSVs made from them) is mutated (lines deleted,
duplicated, swapped, cut short, tokens replaced by ``8K``, ``-16``, ``nan``, ``1e400``, a
40-digit number, garbage inserted; JSON values replaced by wrong types and non-finite
numbers; YAML profiles given aliases, tags, deep nesting) and fed through the public entry
points: :func:`read_results`, :func:`fit_profile`, :meth:`CalibrationProfile.load` and a
query. The only exceptions allowed are :class:`~ddlsim.errors.DDLSimError` subclasses.

Bounded for CI (a few seconds, examples fixed by ``derandomize``); set
``DDLSIM_FUZZ_EXAMPLES=2000`` for a longer local run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.build import fit_profile
from ddlsim.calibration.outputs import write_csv
from ddlsim.calibration.readers import read_results
from ddlsim.errors import DDLSimError

DATA = Path(__file__).parent / "data"
EXAMPLES = int(os.environ.get("DDLSIM_FUZZ_EXAMPLES", "8"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

NASTY = ["8K", "-16", "nan", "NaN", "inf", "-inf", "1e400", "-0", "0", "0.00", "", "N/A",
         "1.2.3", "9" * 40, "1e-300", "ä", "{", "[", "]", "#", ",", '"', "true", "null",
         "-1e308", "2e60", "&a", "*a", "!!python/object:os.system", "<<: *a", ".inf", ".nan",
         "- [", "9" * 5000, "\t", "x:", "1e15", "4294967296000000", "99999999999999999999",
         "1e19"]
JSON_NASTY = [None, True, "8K", -16, 1e308, float("nan"), float("inf"), [], {}, "", 10 ** 30,
              2 ** 63, -1, 0, [[[[]]]], {"time": "x"}, {"time": -1}, 1.5]

LINE_EDIT = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 10 ** 6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10 ** 6)),
    st.tuples(st.just("swap"), st.integers(0, 10 ** 6), st.integers(0, 10 ** 6)),
    st.tuples(st.just("cut"), st.integers(0, 10 ** 6)),
    st.tuples(st.just("token"), st.integers(0, 10 ** 6), st.integers(0, 40),
              st.sampled_from(NASTY)),
    st.tuples(st.just("insert"), st.integers(0, 10 ** 6), st.text(max_size=40)),
)


def mutate(text: str, edits: list[tuple], sep: str | None = None) -> str:
    """Apply line ``edits`` to ``text``; ``sep`` splits a line into tokens (None: spaces)."""
    lines = text.splitlines()
    for kind, i, *rest in edits:
        if kind == "cut":
            text = "\n".join(lines)
            return text[: i % (len(text) + 1)]
        if not lines:
            lines = [""]
        i %= len(lines)
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = rest[0] % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "token":
            tokens = lines[i].split(sep)
            if tokens:
                tokens[rest[0] % len(tokens)] = rest[1]
            lines[i] = (sep or "  ").join(tokens)
        else:
            lines.insert(i, rest[0])
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, tuple[str, dict, str | None]]:
    """name → (text, reader keyword arguments, token separator)."""
    out = {p.name: (p.read_text(), {"ranks": 4, "nodes": 1} if p.name.startswith("osu_all")
                    else {"nodes": 1} if p.name.startswith("osu") else {}, None)
           for p in sorted(DATA.iterdir()) if p.suffix in (".txt", ".json")}
    tmp = tmp_path_factory.mktemp("csv")
    comm = write_csv(tmp / "comm.csv", read_results(DATA / "nccl_all_reduce_perf.txt").table)
    out["comm.csv"] = (comm.read_text(), {}, ",")
    flops = 2.0 * np.array([64, 128, 256, 512, 1024]) ** 3
    compute = pd.DataFrame({"backend": "numpy", "library_version": "2", "device": "cpu",
                            "kind": "gemm", "dtype": "fp32", "m": [64, 128, 256, 512, 1024],
                            "n": 0, "k": 0, "batch": 0, "heads": 0, "seq": 0, "head_dim": 0,
                            "flops": flops, "time_mean_s": flops / 1e11,
                            "time_median_s": flops / 1e11, "time_min_s": flops / 1.1e11,
                            "time_max_s": flops / 0.9e11, "time_std_s": 1e-6, "reps": 3,
                            "flops_per_s": 1e11 * flops / (flops + 1e8)})
    out["compute.csv"] = (compute.to_csv(index=False), {}, ",")
    return out


def read_and_fit(path: Path, kwargs: dict, fmt: str, fit: bool = True) -> None:
    """The public path of ``calibrate fit``; returns quietly or raises a DDLSimError."""
    try:
        got = read_results(path, fmt, **kwargs)
        if fit and len(got.table):
            fit_profile([got], bootstrap=2, max_skipped_share=1.0, max_segments=2)
    except DDLSimError:
        pass


NAMES = ["nccl_all_reduce_perf.txt", "nccl_all_gather.txt", "nccl_reduce_scatter.json",
         "osu_allreduce.txt", "osu_allgather.txt", "osu_latency.txt", "osu_bw.txt", "comm.csv",
         "compute.csv"]


def _damaged(samples, tmp_path: Path, name: str, edits: list) -> tuple[Path, dict, str]:
    text, kwargs, sep = samples[name]
    path = tmp_path / name  # same name: old nccl-tests files name their op only there
    path.write_text(mutate(text, edits, sep), encoding="utf-8")
    fmt = {".json": "nccl-tests-json", ".csv": "ddlsim" if name == "comm.csv" else
           "ddlsim-compute"}.get(path.suffix, "osu" if name.startswith("osu") else "nccl-tests")
    return path, kwargs, fmt


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(edits=st.lists(LINE_EDIT, min_size=1, max_size=5), auto=st.booleans())
def test_damaged_results_files_raise_only_ddlsim_errors(samples, tmp_path, name, edits, auto):
    path, kwargs, fmt = _damaged(samples, tmp_path, name, edits)
    read_and_fit(path, kwargs, "auto" if auto else fmt, fit=False)


@pytest.mark.parametrize("name", ["nccl_all_reduce_perf.txt", "osu_latency.txt", "compute.csv"])
@FUZZ
@given(edits=st.lists(LINE_EDIT, min_size=1, max_size=5))
def test_fits_of_damaged_files_raise_only_ddlsim_errors(samples, tmp_path, name, edits):
    path, kwargs, fmt = _damaged(samples, tmp_path, name, edits)
    read_and_fit(path, kwargs, fmt)


JSON_EDIT = st.tuples(st.integers(0, 10 ** 6),
                      st.sampled_from(["size", "count", "type", "out_of_place", "in_place",
                                       "out_of_place_per_iter", "in_place_per_iter", "time",
                                       "p50_us", "times_us", "skipped_iterations", "results",
                                       "config", "nccl_version", "args", "devices", "rank",
                                       "iterations"]),
                      st.sampled_from(JSON_NASTY))


def _set_json(doc: dict, index: int, key: str, value: object) -> None:
    results = doc.get("results") if isinstance(doc.get("results"), list) else []
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    targets = [doc, config] + results + [
        b for r in results if isinstance(r, dict) for b in r.values() if isinstance(b, dict)]
    devices = config.get("devices")
    targets += devices if isinstance(devices, list) else []
    target = targets[index % len(targets)]
    if isinstance(target, dict):
        target[key] = value


@FUZZ
@given(edits=st.lists(JSON_EDIT, min_size=1, max_size=6))
def test_damaged_nccl_tests_json_raises_only_ddlsim_errors(tmp_path, edits):
    doc = json.loads((DATA / "nccl_reduce_scatter.json").read_text())
    for index, key, value in edits:
        _set_json(doc, index, key, value)
    path = tmp_path / "reduce_scatter.json"
    path.write_text(json.dumps(doc, indent=1))
    read_and_fit(path, {}, "auto", fit=False)


@pytest.fixture(scope="module")
def profile_text(tmp_path_factory) -> str:
    got = read_results(DATA / "nccl_all_reduce_perf.txt")
    path = fit_profile([got], bootstrap=5).save(tmp_path_factory.mktemp("p") / "p.yaml")
    return path.read_text()


@FUZZ
@given(edits=st.lists(LINE_EDIT, min_size=1, max_size=5))
def test_damaged_profiles_raise_only_ddlsim_errors(profile_text, tmp_path, edits):
    path = tmp_path / "profile.yaml"
    path.write_text(mutate(profile_text, edits), encoding="utf-8")
    try:
        prof = CalibrationProfile.load(path)
        for e in prof.doc.comm:
            prof.time_s(e.backend, e.op, 1e6, e.ranks, e.scope)
            prof.interval_s(e.backend, e.op, 1e6, e.ranks, e.scope)
    except DDLSimError:
        pass
