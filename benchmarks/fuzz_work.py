"""The fuzzer's ``work`` target (issue 31's first contact; ``benchmarks/fuzz.py``):
``sweep``/``search`` ranges and axes that are huge, long, nested or of the wrong type, saved
results and mpiP reports with impossible numbers, ``calibrate fit --max-segments``, options
given twice, outputs naming an input.
"""

from __future__ import annotations

import copy
import json
import random

from fuzz_docs import REPO

# ------------------------------------------------------------------ work (issue 31)
WIKI = "@examples/wiki-gpt2-9ranks-reduce_scatter.yaml"
SEARCH = "@examples/search-gpt3-175b-1024.yaml"
SWEPT = ["train.micro_batch_size", "parallel.tensor_model_parallel_size", "parallel.zero_stage",
         "system.nic.bandwidth_Bps", "system.nodes", "train.recompute", "parallel.sequence_parallel",
         "model.hidden_size", "parallel.collective_algorithm", "no.such_field", "train"]
SPECS = ["1:100000000", "1:" + "9" * 30, "1:8", "-5:5", "0:0", "5:1", "1:64:*1", "1:64:*2",
         "1:8:0", "1:2**9", "1.5:3", "true,false", "true,2", "2.5,4", "1,1", "1,,2", ",", "",
         "[1,2],4", "{a: 1}", "1,[2]", "99999999999999999999", "-1,2", "0", "null,2", "x,y",
         "none,full", "1,2 Gb/s", "100,200,400 Gb/s", "10 furlongs", "nan,1", ".inf", "1e400",
         "!!python/name:os.system", "&a 1,*a", "1:3 Gb/s", "ring,tree", "{all_reduce: ring}"]
AXIS_VALUES = [[True, 2], [2.5, 4], [[1, 2], 4], ["x", 2], [None, 2], [1, {"a": 1}], [],
               list(range(1, 200_002)), [10**30], [-1, 2], [float("nan")], "1:100000000",
               "1:8", [1, 2, 4], "none,full", [0, 1, 2, 3]]
RESULT_FIELDS = [("iteration_time_s",), ("samples_per_s",), ("mfu",), ("flops_per_device",),
                 ("breakdown", "compute_s"), ("breakdown", "bubble_s"), ("breakdown",),
                 ("memory_per_device_bytes", "total"), ("world_size",), ("config",),
                 ("breakdown", "exposed_comm_s"), ("comm_bytes",), ("engine",)]
RESULT_VALUES = [0, -1.0, 1e400, "NaN", "x", None, [], {}, True, 10**30, -0.0, 2**63]
MPIP_HEAD = ("@--- Callsite Message Sent statistics (all, sent bytes) ----\n---------\n"
             "Name Site Rank Count Max Mean Min Sum\n")
MPIP_ROWS = ["Allreduce 1 0 10 1 1 1 {sum}", "Allreduce 1 {rank} 10 1 1 1 8",
             "Allreduce 1 0 {count} 1 1 1 8", "Allreduce 1 * 10 1 1 1 8", "Allreduce 1 0 10",
             "Iallreduce 1 3 1 1 1 1 1e18", "Bcast 2 1 4 8 8 8 32"]


def _saved_result() -> dict:
    """The JSON ``predict -f json`` saves for the small wiki example (made once per worker)."""
    global _SAVED
    try:
        return _SAVED
    except NameError:
        import ddlsim
        _SAVED = ddlsim.predict(str(REPO / WIKI[1:])).to_dict()
        return _SAVED


def gen_work(rng: random.Random, light: bool = False) -> dict:
    """Issue 31's classes: budgets, value checks, saved inputs, repeated options, outputs
    over inputs (module docstring)."""
    c = rng.choice
    kind = c(["sweep", "sweep", "search", "search_file", "compare", "mpip", "segments",
              "twice", "over_input", "huge_option"])
    files: dict = {}
    cap = ["--limit", "sweep_runs=32"] if rng.random() < 0.9 else []  # keep valid cases short
    if kind == "sweep":
        spec = c(SPECS) if rng.random() < 0.8 else ",".join(
            map(str, range(1, c([10, 1000, 100_001, 100_002]))))
        argv = ["sweep", WIKI, "--set-range", f"{c(SWEPT)}={spec}", *cap]
        argv += c([[], [], ["--max-runs", c(["0", "1", "-1", "1e3"])], ["--engine", "des"],
                   ["--limit", c(["axis_values=5", "sweep_runs=1", "nope=1", "sweep_runs=0"])]])
    elif kind == "search":
        spec = c(SPECS)
        argv = ["search", SEARCH, "--axis", f"{c(SWEPT[:3] + SWEPT[5:7])}={spec}",
                "--top", c(["0", "1"])]
        argv += c([[], ["--limit", "search_plans=10"], ["--limit", "axis_values=3"],
                   ["--axis", f"{c(SWEPT[:3])}={c(SPECS)}"]])
    elif kind == "search_file":
        import yaml
        doc = yaml.safe_load((REPO / SEARCH[1:]).read_text())
        doc["search"]["axes"] = {c(SWEPT[:3] + SWEPT[5:7]): copy.deepcopy(c(AXIS_VALUES))}
        doc["search"]["top"] = c([0, 1, -1, 1e9, True])
        files = {"search.yaml": json.dumps(doc)}
        argv = ["search", "search.yaml"]
    elif kind == "compare":
        doc = copy.deepcopy(_saved_result())
        path = c(RESULT_FIELDS)
        value = c(RESULT_VALUES)
        if len(path) == 1:
            doc[path[0]] = value
        elif isinstance(doc.get(path[0]), dict):
            doc[path[0]][path[1]] = value
        text = json.dumps(doc, default=str).replace('"NaN"', "NaN")
        files = {"r.json": json.dumps(_saved_result()), "bad.json": text}
        argv = ["compare", "r.json", "bad.json", *c([[], ["-f", "json"], ["-f", "csv"]])]
    elif kind == "mpip":
        rows = [c(MPIP_ROWS).format(sum=c(["8", "nan", "inf", "-inf", "-8", "1e400", "x"]),
                                    rank=c(["0", "-1", "99999999", "x", "1.5"]),
                                    count=c(["1", "99999999999999999999", "-1", "0"]))
                for _ in range(c([0, 1, 3]))]
        files = {"r.mpip": MPIP_HEAD + "\n".join(rows) + "\n"}
        argv = ["comm", WIKI, "--diff-mpip", "r.mpip", *c([[], ["-f", "json"], ["-f", "csv"],
                                                          ["--iterations", c(["0", "-1", "2"])]])]
    elif kind == "segments":
        argv = ["calibrate", "fit", "@tests/calibration/data/nccl_all_reduce_perf.txt", "-o",
                "p.yaml", "--bootstrap", "0", "--max-segments",
                c(["1000000", "101", "100", "3", "0", "-1", "1e9"])]
        argv += c([[], ["--limit", "fit_segments=1000"], ["--limit", "fit_segments=x"]])
    elif kind == "huge_option":  # every count option of the commands with work, 10^20
        big = c(["99999999999999999999", "1e400", "-99999999999999999999"])
        argv = c([["predict", WIKI, "--engine", "des", "--links", big],
                  ["sweep", WIKI, "--set-range", "train.micro_batch_size=1", "--dask", "local",
                   "--dask-workers", big],
                  ["sweep", WIKI, "--set-range", "train.micro_batch_size=1", "--max-runs", big],
                  ["search", SEARCH, "--top", big], ["search", SEARCH, "--max-gpus", big],
                  ["search", SEARCH, "--price-per-gpu-hour", big, "--top", "0"],
                  ["comm", WIKI, "--iterations", big],
                  ["calibrate", "fit", "@tests/calibration/data/nccl_all_reduce_perf.txt",
                   "-o", "p.yaml", c(["--bootstrap", "--seed", "--min-points", "--ranks",
                                      "--max-skipped-share"]), big],
                  ["topology", "show", "dgx-a100", "--nodes", big],
                  ["predict", WIKI, "--limit", f"ranks={big}"]])
    elif kind == "twice":
        argv = c([["predict", WIKI, "-o", "a.json", "-o", "b.json"],
                  ["predict", WIKI, "--model", "gpt2", "--model=llama-2-7b"],
                  ["predict", WIKI, "--engine", "des", "--engine", "analytical"],
                  ["sweep", WIKI, "--set-range", "train.micro_batch_size=1,2", "-o", "a.csv",
                   "--output", "b.csv"],
                  ["calibrate", "fit", "x.csv", "-o", "a.yaml", "-o", "b.yaml"],
                  ["predict", WIKI, "--limit", "ranks=10", "--limit", "ranks=20"]])
    else:
        text = (REPO / WIKI[1:]).read_text()
        files = {"c.yaml": text, "prof.yaml": "x: 1\n"}
        argv = c([["predict", "c.yaml", "-o", "c.yaml"], ["predict", "c.yaml", "--plot", "c.yaml"],
                  ["comm", "c.yaml", "-o", "c.yaml"], ["compare", "c.yaml", "c.yaml", "-o", "c.yaml"],
                  ["sweep", "c.yaml", "--set-range", "train.micro_batch_size=1", "-o", "c.yaml"],
                  ["calibrate", "fit", "prof.yaml", "-o", "prof.yaml"]])
        argv += ["--force"] if rng.random() < 0.7 else []
    return {"target": "work", "kind": kind, "files": files, "argv": argv,
            "desc": " ".join(a if len(a) < 80 else a[:80] + f"…({len(a)} chars)" for a in argv)}
