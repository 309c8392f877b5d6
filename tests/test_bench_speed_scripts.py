"""The speed benchmarks' own plumbing (issue 27): the scripts the docs tell a user to run must
run. Both failures below reached a user before these tests: ``search_counts.py`` wrapped
functions whose signatures had since grown (a TypeError on its first call) and
``des_speed.py``'s scaling table asked for 2,048-8,192 GPUs under the default work budget
(WorkTooLargeError after its first rows)."""

from __future__ import annotations

from benchscripts import load_script


def test_search_counts_runs_and_counts_distinct_inputs():
    """One cold grid with the counters on: every step ran, no step has more distinct inputs
    than runs, and each distinct op list is lowered exactly once."""
    counts = load_script("search_counts").grid_counts()
    total, valid = counts["plans in the grid / valid"]
    assert total > valid > 0
    for step, (runs, distinct) in counts.items():
        if runs is not None and distinct is not None and step != "plans in the grid / valid":
            assert runs >= distinct > 0, (step, runs, distinct)
    lowered, distinct_lowered = counts["  op lists lowered"]
    assert lowered == distinct_lowered == counts["  pieces built (by key) / op lists"][1]


def test_des_speed_table_runs_under_the_targets_budget(monkeypatch):
    """The scaling table's runs take the targets' work budget, which admits its 8,192-GPU
    row (the default refuses it)."""
    des_speed = load_script("des_speed")
    seen = {}

    def fake_predict(cfg, engine="analytical", **kwargs):
        seen.update(kwargs, engine=engine)
        return "result"

    monkeypatch.setattr(des_speed.ddlsim, "predict", fake_predict)
    wall, result = des_speed.time_des(des_speed.config(8192))
    assert result == "result" and wall >= 0
    assert seen["engine"] == "des" and seen["limits"] is des_speed.TARGET_LIMITS

    import ddlsim
    from ddlsim.limits import check_work
    cfg = ddlsim.load_config(des_speed.config(8192))
    check_work(cfg, "des", des_speed.TARGET_LIMITS, ddlsim.api.build_workload(cfg))
