"""The fuzzer's case generators by target (``benchmarks/fuzz.py``): ``cli`` (generated config
files), ``cli_opts`` (malformed options of every command), ``api`` (mutated mappings),
``calibration`` (corrupted result files) and ``work`` (:mod:`fuzz_work`); case K of run
SEED is :func:`make_case` ``(SEED, K)``, drawn from ``random.Random("ddlsim-fuzz:SEED:K")``
alone.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

from fuzz_docs import (BAD_VALUES, EXAMPLES, REPO, SMALL, _base, _config_file, _paths, _set,
                       _short, _yaml_text, mutate_doc)
from fuzz_work import gen_work

TARGETS = {"cli": 0.3, "cli_opts": 0.17, "api": 0.25, "calibration": 0.13, "work": 0.15}
DATA = REPO / "tests" / "calibration" / "data"
DATA_FILES = ("nccl_all_gather.txt", "nccl_all_reduce_perf.txt", "nccl_reduce_scatter.json",
              "osu_allgather.txt", "osu_allreduce.txt", "osu_bw.txt", "osu_latency.txt")


def gen_cli(rng: random.Random, light: bool = False) -> dict:
    special = rng.random()
    if special < 0.06:
        kind = rng.choice(["dir", "fifo", "/dev/zero", "/dev/null", "missing", "unreadable",
                           "symlink", "symlink-loop", "-"])
        if light and kind in ("fifo", "/dev/zero"):
            kind = "dir"
        files = {} if kind != "unreadable" else {"config.yaml": (REPO / "examples" / (
            SMALL[0] + ".yaml")).read_text()}
        path = {"/dev/zero": "/dev/zero", "/dev/null": "/dev/null", "-": "-",
                "missing": "no/such.yaml"}.get(kind, "config.yaml")
        return {"target": "cli", "kind": f"path:{kind}", "files": files, "special": kind,
                "argv": ["predict", path], "desc": f"config path is {kind}"}
    small = rng.random() < 0.15
    files, name, desc = _config_file(rng, small)
    while light and isinstance(files[name], tuple):
        files, name, desc = _config_file(rng, small)
    argv = ["predict", name] + (["-f", "json"] if rng.random() < 0.6 else [])
    argv += ["--allow-oom"] if rng.random() < 0.15 else []
    if small:
        argv += ["--engine", rng.choice(["des", "both"])]
    if rng.random() < 0.07:
        argv = ["topology", "show", name]
    return {"target": "cli", "kind": desc.split("; ")[-1] if "; " in desc else "example",
            "files": files, "argv": argv, "desc": desc}


SETS = ["", "=", "parallel", "parallel.", ".=1", "parallel=4", "foo.bar=1", "model.name.x=1",
        "model.num_hidden_layers.x.y=2", "train.micro_batch_size", "train.micro_batch_size=",
        "train.micro_batch_size=[1,", "train.micro_batch_size={a: [", "system.nodes=1e9",
        "system.nodes=10000000000", "train.global_batch_size=1e30", "system.nic.bandwidth_Bps=200",
        "system.nic.bandwidth_Bps=200 gbps", "system.nic.latency_s=1e400 s",
        "system.network.oversubscription=.inf", "parallel.zero_stage=!!python/name:os.system",
        "parallel.collective_algorithm={reduce: binomial}", "system=cpu-10gbe",
        "system.preset=dgx-a100", "model.preset=no-such", "parallel.tensor_model_parallel_size=2",
        "train.seq_length=0x40", "system.placement=[0, 0]", "model..hidden_size=1",
        "system.device.peak_flops.fp32=nan", "train.dtype=fp8", "parallel.sequence_parallel=yes",
        "system.network.torus_dims=[3, 3]", "model.num_hidden_layers=1000000000", " = ",
        "train.micro_batch_size=&a 1", "system.nodes=*a", "train=={}"]


def gen_cli_opts(rng: random.Random, light: bool = False) -> dict:
    ex = "@examples/" + rng.choice(SMALL if rng.random() < 0.7 else EXAMPLES) + ".yaml"
    c = rng.choice
    kind = c(["set", "set", "option", "output", "output", "trace", "command", "topology",
              "calibrate", "presets"])
    files: dict = {}
    special = None
    if kind == "set":
        argv = ["predict", ex] + sum((["--set", c(SETS)] for _ in range(c([1, 1, 2]))), [])
    elif kind == "option":
        argv = ["predict", ex] + c([["--links", "-3"], ["--links", "abc"], ["--links", "10000000"],
                                    ["--engine", "foo"], ["--engine", ""], ["--format", "foo"],
                                    ["-f", "JSON"], ["--backend", "nccl"], ["--backend", "auto"],
                                    ["--calibration", "missing.yaml"], ["--calibration", "/dev/null"],
                                    ["--calibration", "@examples"], ["--allow-oom"], ["--force"],
                                    ["--links", "3"], ["--version"], ["--set"], ["-o"],
                                    ["--calibration", "@ddlsim/data/calibration/dgx-a100.yaml",
                                     "--backend", c(["nccl", "mpi", "auto", "x"])]])
    elif kind in ("output", "trace"):
        ex = ex if kind == "output" else "@examples/" + rng.choice(SMALL) + ".yaml"
        special = c(["dir", "existing", "symlink", "dangling", "/dev/null", "nested", "under-file",
                     "new", "-"])
        flag = "-o" if kind == "output" else "--trace"
        path = {"dir": ".", "/dev/null": "/dev/null", "nested": "a/b/c/out.json", "-": "-",
                "under-file": "file.txt/out.json"}.get(special, "out.json")
        argv = ["predict", ex, flag, path] + (["-f", "json"] if rng.random() < 0.5 else [])
        if kind == "trace":
            argv += ["--engine", c(["des", "analytical", "both"])]
        argv += ["--force"] if rng.random() < 0.4 else []
        special = "out:" + special
    elif kind == "command":
        argv = c([["bogus"], [], ["predict"], ["--help"], ["predict", "--help"], ["sweep"],
                  ["compare", ex, ex], ["predict", ex, ex], ["calibrate", "bogus"],
                  ["topology"], ["topology", "draw"]])
    elif kind == "topology":
        argv = ["topology", "show", c(["dgx-a100", "cpu-10gbe", "dgx1-v100", "nope", "", ex])]
        argv += c([["--nodes", str(c([0, -1, 1, 2, 3, 7, 64, 1000, 10**5, 10**9, 2**63]))],
                   ["--nodes", "1e3"], ["--format", "yaml"], ["--format", "json"],
                   ["--draw", "."], ["--draw", "file.txt/x.png"], []])
    elif kind == "calibrate":
        argv = c([["calibrate", "show", c(["missing.yaml", "/dev/null", ".",
                                           "@ddlsim/data/calibration/dgx-a100.yaml"])],
                  ["calibrate", "fit", "@tests/calibration/data/nccl_all_reduce_perf.txt",
                   "-o", "p.yaml"] + c([["--bootstrap", "-1"], ["--max-segments", "0"],
                                        ["--min-points", "0"], ["--statistic", "foo"],
                                        ["--peak", "fp32"], ["--peak", "fp32=abc"],
                                        ["--system", "nope"], ["--format", "osu"],
                                        ["--ranks", "0"], ["--ranks", "-2"], ["--scope", "rack"],
                                        ["--op", "nope"], ["--bootstrap", "0"]]),
                  ["calibrate", "compute", "--backend", "nope"],
                  ["calibrate", "compute", "--max-dim", "0", "-o", "c.csv"],
                  ["calibrate", "comm", "--backend", "nope"]])
    else:
        argv = ["presets"] + c([[], ["badsection"], ["model"], [""], ["system", "extra"]])
    if special in ("out:existing", "out:under-file"):
        files = {"out.json" if special == "out:existing" else "file.txt": "old\n"}
    return {"target": "cli_opts", "kind": kind if kind != "output" else f"-o {special}",
            "files": files, "argv": argv, "special": special, "desc": " ".join(argv)}


def gen_api(rng: random.Random, light: bool = False) -> dict:
    small = rng.random() < 0.1
    base, doc = _base(rng, small)
    doc, done = mutate_doc(rng, doc)
    extra = rng.random()
    if extra < 0.05:
        import numpy as np
        _set(doc, rng.choice(list(_paths(doc)) or [("model",)]),
             rng.choice([np.int64(8), np.float32(1.5), np.nan, (1, 2), {1, 2}, b"bytes", object()]))
        done.append("python object")
    elif extra < 0.07:
        doc["model"] = dict(doc["model"]) if isinstance(doc.get("model"), dict) else {}
        doc["model"]["self"] = doc["model"]
        done.append("cyclic mapping")
    fn = rng.choice(["load_config", "predict", "predict"])
    kwargs: dict = {}
    if fn == "predict":
        kwargs = rng.choice([{}, {}, {"check_fit": False}, {"engine": "foo"},
                             {"calibration": "missing.yaml"}, {"backend": "nccl"}])
        if small and rng.random() < 0.5:
            kwargs["engine"] = "des"
    elif rng.random() < 0.3:
        kwargs = {"overrides": [rng.choice(SETS)]}
    return {"target": "api", "kind": (done[-1].split("=")[0] if done else "example"),
            "api": {"fn": fn, "args": [doc], "kwargs": kwargs},
            "desc": f"ddlsim.{fn}(<{base}: {'; '.join(done)}>, **{_short(kwargs)})"}


BAD_NUMBERS = ["abc", "nan", "NaN", "inf", "-16", "0", "8K", "1e400", "", "-0", "1e-400", "0x10",
               "１２", "1,024", "-1e30", "None", "N/A", "9" * 40]


def _csv_sample() -> str:
    from ddlsim.calibration.readers import read_results
    return read_results(DATA / "nccl_all_reduce_perf.txt").table.to_csv(index=False)


def corrupt(rng: random.Random, text: str) -> tuple[str | bytes, str]:
    """A corrupted results file."""
    lines = text.splitlines()
    rows = [i for i, ln in enumerate(lines) if re.match(r"\s*[\d\[{\"]", ln) or "," in ln]
    op = rng.choice(["number", "number", "number", "shuffle", "dup", "short", "long", "trunc",
                     "head", "empty", "comments", "binary", "latin1", "crlf", "json"])
    if op == "number" and rows:
        for i in rng.sample(rows, min(len(rows), rng.choice([1, 1, 3, len(rows)]))):
            toks = re.split(r"(\s+|,)", lines[i])
            nums = [j for j, t in enumerate(toks) if re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?", t)]
            if nums:
                toks[rng.choice(nums)] = rng.choice(BAD_NUMBERS)
            lines[i] = "".join(toks)
        return "\n".join(lines) + "\n", "non-numeric"
    if op == "shuffle" and rows:
        vals = [lines[i] for i in rows]
        rng.shuffle(vals) if rng.random() < 0.5 else vals.reverse()
        for i, v in zip(rows, vals):
            lines[i] = v
        return "\n".join(lines) + "\n", "non-monotone rows"
    if op == "dup" and rows:
        i = rng.choice(rows)
        lines.insert(i, lines[i])
        return "\n".join(lines) + "\n", "duplicate row"
    if op in ("short", "long") and rows:
        i = rng.choice(rows)
        lines[i] = lines[i].rsplit(None, 2)[0] if op == "short" else lines[i] + "  7 7 7"
        return "\n".join(lines) + "\n", f"{op} row"
    if op == "trunc":
        return text[:rng.randrange(len(text) + 1)], "truncated"
    if op == "head":
        return "\n".join(ln for ln in lines if not ln.lstrip().startswith(("#", "size", "backend"))
                         ) + "\n", "no header"
    if op == "comments":
        return "\n".join(ln for ln in lines if ln.lstrip().startswith("#")) + "\n", "no rows"
    if op == "binary":
        return rng.randbytes(rng.choice([10, 1000])), "binary"
    if op == "latin1":
        return ("# mesuré à Zürich\n" + text).encode("latin-1", "replace"), "latin-1"
    if op == "crlf":
        return text.replace("\n", "\r\n"), "CRLF"
    if op == "json" and text.lstrip().startswith("{"):
        doc = json.loads(text)
        k = rng.choice(["results", "config", "version", "nccl_version", "args"])
        doc[k] = copy.deepcopy(rng.choice([{}, [], None, "x", [1, 2], [{"size": "abc"}],
                                           [{"size": 8, "out_of_place": {"time": -1}}],
                                           [{"size": 8, "in_place": None}], 1e400]))
        return json.dumps(doc), f"json {k}"
    return "", "empty"


def gen_calibration(rng: random.Random, light: bool = False) -> dict:
    src = rng.choice(DATA_FILES + ("ddlsim.csv", "profile.yaml"))
    if src == "profile.yaml":
        import yaml
        doc, done = _profile_mutation(rng, yaml.safe_load(
            (REPO / "ddlsim/data/calibration/dgx-a100.yaml").read_text()))
        files = {"profile.yaml": _yaml_text(rng, doc)}
        argv = rng.choice([["calibrate", "show", "profile.yaml"],
                           ["predict", "@examples/gpt2-2ranks-one-node.yaml", "--calibration",
                            "profile.yaml", "--backend", rng.choice(["nccl", "auto"])]])
        return {"target": "calibration", "kind": "profile " + done, "files": files, "argv": argv,
                "desc": f"dgx-a100 profile, {done}: {' '.join(argv)}"}
    text = _csv_sample() if src == "ddlsim.csv" else (DATA / src).read_text()
    content, what = corrupt(rng, text) if rng.random() < 0.9 else (text, "unchanged")
    name = "data" + Path(src).suffix
    if "osu" in src or rng.random() < 0.1:
        opts = rng.choice([{"ranks": 4, "nodes": 1}, {"ranks": 8, "scope": "inter"}, {}])
    else:
        opts = {}
    fmt = "auto" if rng.random() < 0.85 else rng.choice(
        ["ddlsim", "ddlsim-compute", "nccl-tests", "nccl-tests-json", "osu", "bogus"])
    files = {name: content}
    if rng.random() < 0.5:
        return {"target": "calibration", "kind": what, "files": files,
                "api": {"fn": "read_results", "args": [name, fmt], "kwargs": opts},
                "desc": f"read_results({src} {what}, {fmt!r}, **{opts})"}
    argv = ["calibrate", "fit", name, "-o", "p.yaml", "--format", fmt,
            "--bootstrap", rng.choice(["0", "0", "20"])]
    for k, v in opts.items():
        argv += [f"--{k}", str(v)]
    return {"target": "calibration", "kind": what, "files": files, "argv": argv,
            "desc": f"{src} {what}: {' '.join(argv)}"}


def _profile_mutation(rng: random.Random, doc: dict) -> tuple[dict, str]:
    paths = list(_paths(doc))
    path, value = rng.choice(paths), rng.choice(BAD_VALUES[:40] + [-1e-5, 0.0])
    if isinstance(doc.get("comm"), list) and rng.random() < 0.6:
        seg = doc["comm"][0]["segments"][0]
        k = rng.choice(list(seg))
        seg[k] = value
        return doc, f"comm[0].segments[0].{k}={_short(value, 30)}"
    _set(doc, path, value)
    return doc, f"{'.'.join(map(str, path))}={_short(value, 30)}"


GENERATORS = {"cli": gen_cli, "cli_opts": gen_cli_opts, "api": gen_api,
              "calibration": gen_calibration, "work": gen_work}


def generate(rng: random.Random, target: str | None = None, light: bool = False) -> dict:
    """One case for ``target`` (drawn by weight when None). ``light`` leaves out huge files,
    FIFOs and /dev/zero (for the test suite)."""
    if target is None:
        target = rng.choices(list(TARGETS), list(TARGETS.values()))[0]
    return GENERATORS[target](rng, light)


def make_case(seed: int, k: int) -> dict:
    """Case number ``k`` of run ``seed``: a function of (seed, k) alone."""
    case = generate(random.Random(f"ddlsim-fuzz:{seed}:{k}"))
    case["k"] = k
    return case
