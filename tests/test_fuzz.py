"""No input gives a traceback, a hang or a memory blow-up: a few cases from the generators of
``benchmarks/fuzz.py`` (which runs ≥ 10,000 of them), each in a worker process with a time and
address-space limit, for the Python API and the command line (docs/robustness.md)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from benchscripts import load_script  # puts benchmarks/ on sys.path: fuzz imports its siblings
import fuzz_run  # one case run and judged
import fuzz_targets  # the case generators

fuzz = load_script("fuzz")

#: Per case, well above what any valid small case needs (< 1 s) and far below the issue's 60 s.
TIMEOUT_S = 5


@pytest.fixture(scope="module")
def pool():
    p = fuzz.Pool(jobs=1, timeout=TIMEOUT_S, mem_gb=1.5)
    yield p
    p.close()


def _cases(targets):
    return st.builds(lambda rng, target: fuzz_targets.generate(rng, target, light=True),
                     st.randoms(use_true_random=False), st.sampled_from(targets))


def _check(pool, case):
    (_, res), = pool.run([case])
    assert res["outcome"] in ("ok", "clean error", "skipped"), (
        f"{res['outcome']}: {res.get('error', '')} @ {res.get('frame', '')}\n"
        f"{fuzz.describe(case)}\n{res.get('tail', '')}")


#: Deterministic, bounded: no example database, no shrinking (a case is already printed whole).
BOUNDED = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                   phases=[Phase.explicit, Phase.generate],
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])


@BOUNDED
@given(case=_cases(["api"]))
def test_api_never_raises_anything_but_ddlsim_errors(pool, case):
    _check(pool, case)


@BOUNDED
@given(case=_cases(["cli", "cli_opts", "calibration"]))
def test_cli_and_readers_answer_or_refuse_in_one_paragraph(pool, case):
    _check(pool, case)


def test_cases_are_reproducible_by_number():
    a, b = fuzz.make_case(7, 123), fuzz.make_case(7, 123)
    assert fuzz.describe(a) == fuzz.describe(b)
    assert fuzz.describe(fuzz.make_case(7, 124)) != fuzz.describe(a)


def test_outcomes_are_classified(pool):
    def cli(*argv):
        return {"target": "cli_opts", "argv": list(argv), "desc": " ".join(argv)}

    results = [r["outcome"] for _, r in pool.run([cli("presets", "model"), cli("presets", "nope"),
                                                   cli("predict", "--links", "x", "y.yaml")])]
    assert results == ["ok", "clean error", "clean error"]


def test_timeouts_and_memory_blowups_are_caught_and_the_worker_replaced():
    def call(fn, arg):
        return {"target": "api", "desc": fn, "api": {"fn": fn, "args": [arg], "kwargs": {}}}

    p = fuzz.Pool(jobs=1, timeout=1, mem_gb=1.5)
    try:
        got = [r["outcome"] for _, r in p.run([call("sleep", 30), call("allocate", 4 * 2**30),
                                               call("sleep", 0)])]
    finally:
        p.close()
    assert got == ["timeout", "memory", "ok"]


@pytest.fixture(scope="module")
def work_pool():
    """Issue 31's cases (sweeps, searches, saved results) take up to a few seconds each;
    a resident set over 1 GiB is a failure (``memory``)."""
    p = fuzz.Pool(jobs=1, timeout=30, mem_gb=2.0, rss_gb=1.0)
    yield p
    p.close()


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=_cases(["work"]))
def test_budgets_values_and_outputs_answer_in_ddlsim_words(work_pool, case):
    _check(work_pool, case)


def test_bare_python_messages_are_a_failure_class():
    from ddlsim.errors import ConfigError

    assert fuzz_run._judged(ValueError("tuple.index(x): x not in tuple"))["outcome"] == "bare message"
    assert fuzz_run._judged(OverflowError("Python int too large to convert to C long"))[
        "outcome"] == "bare message"
    wrapped = ConfigError("'r.json': field 'int' object is not subscriptable is missing")
    assert fuzz_run._judged(wrapped)["outcome"] == "bare message"
    assert fuzz_run._judged(ConfigError("train.micro_batch_size = 3: allowed 1, 2, 4"))[
        "outcome"] == "clean error"
    assert fuzz_run._judged(FileNotFoundError(2, "No such file or directory", "x.yaml"))[
        "outcome"] == "clean error"
    assert "bare message" in fuzz.FAILURES and "work" in fuzz.TARGETS
