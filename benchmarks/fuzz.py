"""Fuzz ddlsim: ≥ 10,000 deterministic bad (and good) inputs, each judged ok, clean error,
traceback, timeout or memory.

    python benchmarks/fuzz.py --cases 10000 [--seed 0] [--jobs 2] [--timeout 60] [--rss-gb 1]
                              [--only cli,cli_opts,api,calibration,work] [--show 3]
    python benchmarks/fuzz.py --case K [--seed 0] [--keep DIR]   # replay one case, print it

Targets: ``cli`` (``ddlsim predict``/``topology show`` on generated files: mutated examples and
presets, YAML/JSON tricks, encodings, special paths), ``cli_opts`` (malformed options of every
command), ``api`` (``ddlsim.load_config``/``predict`` on mutated mappings) and ``calibration``
(the nccl-tests/OSU/CSV readers and ``calibrate fit``/``show`` on corrupted result files) and
``work`` (issue 31's first contact: ``sweep``/``search`` ranges and axes that are huge, long,
nested or of the wrong type, saved results and mpiP reports with impossible numbers,
``calibrate fit --max-segments``, options given twice, outputs naming an input).

Outcomes: ``ok`` (exit 0 / a return value), ``clean error`` (exit 2, a message whose line
starts ``error:`` — or click's usage error — and no traceback; in the API a
:class:`ddlsim.errors.DDLSimError`), ``bare message`` (refused, but with a message Python or a
library wrote rather than ddlsim: the CLI runs with ``DDLSIM_DEBUG=1`` so that the exception
itself is judged: a :class:`~ddlsim.errors.DDLSimError`, or an OS or decoding error the CLI
describes, is clean unless its text is one of Python's own (:data:`BARE`); a plain
``ValueError``/``OverflowError`` is bare), ``traceback`` (any other exception or exit status),
``timeout`` (past ``--timeout`` seconds of wall clock) and ``memory`` (``MemoryError`` under the
worker's address-space cap, ``--mem-gb``, or a peak resident set over ``--rss-gb``). Each case runs in a reused worker process that is
killed and replaced on a timeout. Case K is generated from ``random.Random("SEED:K")`` alone, so
``--case K`` replays it anywhere. The exit status is 1 if any case is not ok or a clean error.
See docs/robustness.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"cli": 0.3, "cli_opts": 0.17, "api": 0.25, "calibration": 0.13, "work": 0.15}
OUTCOMES = ("ok", "clean error", "bare message", "traceback", "timeout", "memory")
FAILURES = ("bare message", "traceback", "timeout", "memory")
#: Fragments of messages that Python, numpy or pandas write: an error showing one of these
#: tells the user nothing about their input (issue 31: "tuple.index(x): x not in tuple").
BARE = re.compile(r"not in tuple|not in list|too large to convert|invalid literal for|"
                  r"could not convert|has no attribute|unsupported operand|object is not|"
                  r"index out of range|division by zero|unhashable type|must be real number|"
                  r"argument must be|cannot convert float|out of bounds for|NoneType|"
                  r"Maximum allowed dimension|array is too big|"
                  r"^\W*\w*\W*$", re.I)
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
SMALL = [e for e in EXAMPLES if e.startswith(("wiki", "gpt2"))]
DATA = REPO / "tests" / "calibration" / "data"
DATA_FILES = ("nccl_all_gather.txt", "nccl_all_reduce_perf.txt", "nccl_reduce_scatter.json",
              "osu_allgather.txt", "osu_allreduce.txt", "osu_bw.txt", "osu_latency.txt")


# ================================================================================ inputs
def _nested(depth: int, leaf=1):
    for _ in range(depth):
        leaf = [leaf] if depth % 2 else {"a": leaf}
    return leaf


BAD_VALUES = [None, True, False, 0, -1, -0.0, 1, 3.5, 2**31, 2**63, 10**40, 1e30, 1e9, 1e-30,
              float("nan"), float("inf"), float("-inf"), "", "abc", "3", "true", "1e9", "1e400",
              "200 gbps", "200 Gbps", "1e400 s", "inf Gb/s", "nan GB", "-5 GB/s", "0 s", "5 µs",
              "5 μs", "5 us", "10 Gb/s", "80 GiB", "12 furlongs", "1_000", "0x10", "\x00", "é" * 50,
              "x" * 100_000, [], [1, 2], [[[]]], {}, {"a": 1}, {"preset": 5}, _nested(40)]
SECTION_VALUES = [[], 5, None, True, 1.5, "no-such-preset", "gpt2-124m", "cpu-10gbe", "",
                  {"preset": 5}, {"preset": "no-such"}, {"preset": ["gpt2-124m"]}, [{"a": 1}],
                  {"preset": None}, "dgx-a100"]
TOKENS = ["1e9", "1.0e+9", ".inf", "-.inf", ".nan", "0x1F", "0o17", "1_000", "~", "-0", "+12",
          "12:30", "2001-12-14", "yes", "off", "!!float 1e400", "1e400", "!!int '10000000000000'",
          "!!binary aGVsbG8=", "!!set {a, b}", "!!python/object/apply:os.getcwd []", "!custom 3",
          "&a 5", "*undefined", "'", "\"", "[1, 2", "{a: 1", "@", "`", "|", ">", "%TAG"]


def _bases() -> dict:
    global _BASES
    try:
        return _BASES
    except NameError:
        pass
    import yaml

    from ddlsim.config import resolve_section

    out = {}
    for name in EXAMPLES:
        doc = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
        model = doc.get("model")
        if isinstance(model, dict) and "hf_config" in model:  # relative to the example's folder
            model["hf_config"] = str(REPO / "examples" / model["hf_config"])
        out[name] = doc
        out[name + "+expanded"] = {s: resolve_section(s, v) for s, v in doc.items()}
    _BASES = out
    return out


def _paths(doc, prefix=()):
    """Every key path of a nested mapping (inner nodes and leaves)."""
    for k, v in (doc.items() if isinstance(doc, dict) else ()):
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _set(doc: dict, path: tuple, value) -> None:
    node = doc
    for k in path[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[path[-1]] = value


def _typo(rng: random.Random, key: str) -> str:
    i = rng.randrange(max(len(key), 1))
    op = rng.choice("dswu")
    if op == "d":
        return key[:i] + key[i + 1:] or "x"
    if op == "s" and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    if op == "u":
        return key.upper()
    return key[:i] + key[i] * 2 + key[i + 1:]


def _section(doc: dict, name: str) -> dict:
    """``doc[name]`` as a mapping (a preset name becomes ``{preset: name}``)."""
    s = doc.get(name)
    if not isinstance(s, dict):
        doc[name] = s = {"preset": s} if isinstance(s, str) else {}
    return s


def _scenario(rng: random.Random, doc: dict) -> str:
    """A targeted mutation from the issue's list; returns its name."""
    c = rng.choice
    sysd, model, train, par = (_section(doc, s) for s in ("system", "model", "train", "parallel"))
    name = c(["nodes", "layers", "batch", "sizes", "bandwidth", "latency", "oversub", "torus",
              "fabric", "placement", "algorithm", "peak", "memory", "dtype", "zero", "vpp",
              "efficiency", "bucket", "devices", "valid", "valid", "valid"])
    if name == "nodes":
        sysd["nodes"] = c([1e9, 10**9, 10**7, 10**12, 2**63, 10**40, 1e30, 0, -4, 1.5])
    elif name == "layers":
        model["num_hidden_layers"] = c([1e9, 10**9, 10**6, 10**40, 96.0, 97])
    elif name == "batch":
        mb = train.get("micro_batch_size", 1) if isinstance(train.get("micro_batch_size"), int) else 1
        train["global_batch_size"] = c([mb * 9 * 10**7, mb * 8 * 10**6, 10**30, 1e30, 36 * 10**5])
        train.setdefault("micro_batch_size", 1)
    elif name == "sizes":
        k = c(["hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"])
        model[k] = c([10**6, 10**9, 10**40, 1e30, 7])
        if rng.random() < 0.3:
            train["seq_length"] = model["max_position_embeddings"] = c([10**6, 10**9])
    elif name == "bandwidth":
        where = c([("nic",), ("intra_node",), ("device", "memory_bandwidth_Bps")])
        value = c([200, "200 b/s", 1e-30, "1 bps", "1 kb/s", "inf Gb/s", "1e400 B/s", "200 gbps",
                   "25 GB/s", "100 Gb/s", "100 Gbit/s", "1.25e9"])
        _set(sysd, where + (("bandwidth_Bps",) if len(where) == 1 else ()), value)
    elif name == "latency":
        _set(sysd, (c(["nic", "intra_node"]), "latency_s"),
             c(["5 s", "1e400 s", "inf s", "-1 us", "5 µs", "5 μs", "2 ns", 3600, "1 fortnight"]))
    elif name == "oversub":
        _set(sysd, ("network", "oversubscription"), c([float("inf"), float("nan"), 1e308, 0.5, -1]))
    elif name == "torus":
        _set(sysd, ("network", "topology"), "torus")
        _set(sysd, ("network", "torus_dims"), c([[], [0], [-1, 2], [3, 3], [2] * 12, [1e9], "abc",
                                                 [2.5, 2], [10**6, 10**6], [True, 2], [5], [1, 5],
                                                 None, [2, 2, 2]]))
    elif name == "fabric":
        _set(sysd, ("network", "topology"), c(["dragonfly", "rail_optimized", "fat_tree", "mesh"]))
        _set(sysd, ("network", "nodes_per_leaf"), c([1, 3, 10**9, 0, None, 2.5]))
        sysd["nodes"] = c([sysd.get("nodes", 5), 10**4, 10**5, 10**6, 7, 1])
    elif name == "placement":
        sysd["placement"] = c(["round_robin", "random", [0] * 9, list(range(9))[::-1], [-1],
                               [1.5], ["a"], [True] * 9, list(range(10**5)), list(range(10))])
    elif name == "algorithm":
        par["collective_algorithm"] = c([{"all_reduce": "foo"}, {"foo": "ring"}, "ring", [1],
                                         {"all_reduce": 5}, {"all_reduce": None},
                                         {"reduce": "binomial", "broadcast": "binomial"},
                                         {"all_reduce": "hierarchical", "barrier": "auto"}])
    elif name == "peak":
        _set(sysd, ("device", "peak_flops"), c([{}, {"fp32": 0}, {"bf16": "inf TFLOP/s"},
                                                {"fp64": 1e12}, "fast", {"fp32": "-7 TFLOP/s"},
                                                {"fp32": "7 TFLOPS", "bf16": "7e12"}]))
    elif name == "memory":
        _set(sysd, ("device", "memory_bytes"), c([1, "1 B", 1e30, "80 GiB", "8 PB", "-1 GB"]))
    elif name == "dtype":
        train["dtype"] = c(["fp8", "float32", 32, "FP16", "bf16"])
    elif name == "zero":
        par["zero_stage"] = c([4, -1, 3, "3", 3.0, True, 2])
    elif name == "vpp":
        par["schedule"] = c(["interleaved", "gpipe", "zb-v", "1F1B"])
        par["virtual_pipeline_model_parallel_size"] = c([0, 1, 2, 1e9, 10**6, None])
    elif name == "efficiency":
        sysd["compute_efficiency"] = c([0, 1.5, float("nan"), 1e-30, "75%", 0.5])
    elif name == "bucket":
        par["grad_bucket_size"] = c(["1 B", 1, "1 KiB", 1e-9, "100 MiB", "0 B"])
        par["overlap_grad_reduce"] = c([True, False, "yes", 1])
    elif name == "devices":
        sysd["devices_per_node"] = c([10**6, 3, 0, 2.0, "8"])
        sysd["nics_per_node"] = c([3, 0, 10**6, 1, 16])
    else:
        for k, vals in (("tensor_model_parallel_size", [1, 2, 4, 8]),
                        ("pipeline_model_parallel_size", [1, 2, 4, 8, 16]),
                        ("dp_strategy", ["ddp", "reduce_scatter", "reduce_broadcast",
                                         "sliced_reduce_broadcast"]),
                        ("zero_stage", [0, 1, 2, 3]), ("schedule", ["gpipe", "1f1b"])):
            if rng.random() < 0.4:
                par[k] = c(vals)
        if rng.random() < 0.3:
            par.pop("data_parallel_size", None)
    return name


def mutate_doc(rng: random.Random, doc: dict) -> tuple[dict, list[str]]:
    """Apply 1–3 mutations to a run-config mapping; returns the new mapping and what was done."""
    doc, done = copy.deepcopy(doc), []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.choices(["scenario", "value", "section", "delete", "unknown", "typo", "none"],
                         [35, 30, 8, 7, 6, 8, 6])[0]
        paths = list(_paths(doc))
        if op == "scenario":
            done.append("scenario:" + _scenario(rng, doc))
        elif op == "value" and paths:
            path, value = rng.choice(paths), rng.choice(BAD_VALUES)
            _set(doc, path, copy.deepcopy(value))
            done.append(f"{'.'.join(map(str, path))}={_short(value)}")
        elif op == "section":
            sec = rng.choice(["model", "parallel", "train", "system", "extra"])
            doc[sec] = copy.deepcopy(rng.choice(SECTION_VALUES))
            done.append(f"{sec}={_short(doc[sec])}")
        elif op == "delete" and paths:
            path = rng.choice(paths)
            node = doc
            for k in path[:-1]:
                node = node[k]
            node.pop(path[-1], None)
            done.append(f"del {'.'.join(map(str, path))}")
        elif op in ("unknown", "typo") and paths:
            path = rng.choice(paths)
            key = _typo(rng, str(path[-1])) if op == "typo" else rng.choice(["foo", "nodez", 5, None])
            _set(doc, path[:-1] + (key,), rng.choice([1, "x", {"a": 1}]))
            done.append(f"{op} {'.'.join(map(str, path[:-1] + (key,)))}")
    return doc, done


def _short(value, n: int = 60) -> str:
    s = repr(value)
    return s if len(s) <= n else s[:n] + f"…({len(s)} chars)"


def _base(rng: random.Random, small: bool = False) -> tuple[str, dict]:
    bases = _bases()
    names = [n for n in bases if n.split("+")[0] in SMALL] if small else list(bases)
    name = rng.choice(names)
    return name, bases[name]


def _yaml_text(rng: random.Random, doc) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):  # no anchors for shared sub-objects
        def ignore_aliases(self, data):
            return True

    try:
        return yaml.dump(doc, Dumper=Dumper, sort_keys=False, allow_unicode=rng.random() < 0.5,
                         default_flow_style=rng.choice([False, None, True]), width=10**6)
    except (yaml.YAMLError, RecursionError):
        return json.dumps(doc, default=str)


def _alias_bomb(levels: int, width: int) -> str:
    """A "billion laughs" flow sequence: level i lists level i-1 ``width`` times, so the
    last level stands for ``width**(levels-1)`` strings."""
    parts = ["&a0 [lol]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]"
                             for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def _drop_section(lines: list[str], section: str) -> str:
    """The YAML text without the top-level block ``section:`` (its header and indented body)."""
    out, skip = [], False
    for ln in lines:
        if ln and not ln[0].isspace():
            skip = ln.startswith(section + ":")
        if not skip:
            out.append(ln)
    return "\n".join(out) + "\n"


def text_mutation(rng: random.Random, text: str) -> tuple[str | bytes | tuple, str]:
    """A mutation of the file's text (or bytes): YAML tricks, encodings, truncation, size."""
    op = rng.choices(["token", "dup", "bomb", "deep", "tag", "anchor", "trunc", "flip", "enc",
                      "shape", "huge"], [25, 10, 3, 4, 8, 4, 8, 8, 12, 10, 0.4])[0]
    lines = text.splitlines()
    if op == "token":
        idx = [i for i, ln in enumerate(lines) if re.match(r"\s*[\w-]+: \S", ln)]
        for i in rng.sample(idx, min(len(idx), rng.choice([1, 1, 2]))):
            lines[i] = re.sub(r"(:\s).*$", lambda m: m.group(1) + rng.choice(TOKENS), lines[i])
        return "\n".join(lines) + "\n", "token"
    if op == "dup":
        top = [ln for ln in lines if re.match(r"[\w-]+:", ln)] or ["model: gpt2-124m"]
        return text + rng.choice(top) + "\n", "duplicate key"
    if op == "bomb":
        levels, width = rng.choice([(4, 4), (6, 9), (9, 9), (10, 10)])
        where = rng.choice(["model: {preset: gpt2-124m, source: %s}",
                            "system: {preset: cpu-10gbe, name: %s}", "train: %s",
                            "model: {preset: gpt2-124m, unknown_key: %s}",
                            "model: {preset: gpt2-124m, num_hidden_layers: %s}",
                            "parallel: {collective_algorithm: %s}"])
        return (_drop_section(lines, where.split(":")[0]) + where % _alias_bomb(levels, width) + "\n",
                f"alias bomb {levels}x{width}")
    if op == "deep":
        n = rng.choice([100, 1000, 5000, 50_000])
        o, cl = rng.choice([("[", "]"), ("{a: ", "}")])
        return text + "extra: " + o * n + "1" + cl * n + "\n", f"nesting depth {n}"
    if op == "tag":
        return text + rng.choice(["x: !!python/object/apply:os.getcwd []\n",
                                  "model: !!python/name:os.system\n", "train: !!binary aGk=\n",
                                  "system: !!set {a, b}\n", "parallel: !!omap [a: 1]\n",
                                  "parallel: !local {a: 1}\n", "train: !!timestamp 2001-12-14\n"]), "tag"
    if op == "anchor":
        return ("base: &b {preset: cpu-10gbe}\n" + text + rng.choice(
            ["system: {<<: *b, nodes: 5}\n", "system: *b\n", "system: {<<: [*b, *b]}\n",
             "system: {<<: 5}\n"])), "anchor/merge"
    if op == "trunc":
        return text[:rng.randrange(len(text) + 1)], "truncated"
    if op == "flip":
        b = bytearray(text.encode())
        for _ in range(rng.choice([1, 3, 10])):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "byte flips"
    if op == "enc":
        enc = rng.choice(["utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252", "binary", "nul",
                          "utf-8-sig", "bad-utf8"])
        t = text.replace("model:", "# café é\nmodel:")
        if enc == "binary":
            return rng.randbytes(rng.choice([1, 100, 10_000])), "binary"
        if enc == "nul":
            return t.encode() + b"\x00\n", "NUL byte"
        if enc == "bad-utf8":
            return t.encode() + b"\n# \xc3\x28 \xed\xa0\x80\n", "invalid UTF-8"
        return t.encode(enc, errors="replace"), enc  # a μ has no Latin-1 byte
    if op == "shape":
        return rng.choice(["", "   \n", "# only a comment\n", "---\n", "---\na: 1\n---\nb: 2\n",
                           "42\n", "[1, 2]\n", "null\n", "'just a string'\n", "...\n", "?\n",
                           "model\n", "{\n", "\t\tmodel: x\n"]), "document shape"
    size = rng.choice([5, 20, 40]) * 2**20
    line = rng.choice([b"# padding padding padding padding\n", b"  - 1\n"])
    head = (text + ("extra:\n" if line.startswith(b" ") else "")).encode()
    return ("repeat", head, line, size // len(line)), f"huge file ~{size >> 20} MiB"


def _config_file(rng: random.Random, small: bool = False) -> tuple[dict, str, str]:
    """A generated run-config file: (files, name, description)."""
    base, doc = _base(rng, small)
    desc = [base]
    if rng.random() < 0.85:
        doc, done = mutate_doc(rng, doc)
        desc += done
    suffix = rng.choices([".yaml", ".json", ".yml", ".txt", ""], [60, 25, 5, 5, 5])[0]
    if suffix == ".json":
        text = json.dumps(doc, default=str, indent=rng.choice([None, 2]))
        if rng.random() < 0.2:
            text = text.replace("{", '{"model": "gpt2-124m", ', 1)
            desc.append("JSON duplicate key")
    else:
        text = _yaml_text(rng, doc)
    content: object = text
    if rng.random() < 0.45:
        content, what = text_mutation(rng, text)
        desc.append(what)
    return {f"config{suffix}": content}, f"config{suffix}", "; ".join(desc)


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


# ========================================================================= one case, run
def _materialize(case: dict) -> bool:
    """Write the case's files into the current directory; False when the case cannot be
    made here (chmod 000 does not stop root)."""
    for name, content in case.get("files", {}).items():
        if isinstance(content, tuple):
            _, head, line, times = content
            with open(name, "wb") as fh:
                fh.write(head)
                chunk = line * 4096
                for _ in range(times // 4096):
                    fh.write(chunk)
        else:
            Path(name).write_bytes(content.encode() if isinstance(content, str) else content)
    special = case.get("special")
    if special in ("dir", "out:dir"):
        os.makedirs("config.yaml" if special == "dir" else "d", exist_ok=True)
    elif special == "fifo":
        os.mkfifo("config.yaml")
    elif special == "unreadable":
        os.chmod("config.yaml", 0)
        if os.access("config.yaml", os.R_OK):
            return False
    elif special == "symlink":
        os.symlink(REPO / "examples" / (SMALL[0] + ".yaml"), "config.yaml")
    elif special == "symlink-loop":
        os.symlink("config.yaml", "config.yaml")
    elif special == "out:symlink":
        Path("target.json").write_text("old\n")
        os.symlink("target.json", "out.json")
    elif special == "out:dangling":
        os.symlink("nowhere/target.json", "out.json")
    return True


def _resolve(argv: list) -> list[str]:
    return [str(REPO / a[1:]) if isinstance(a, str) and a.startswith("@") else str(a)
            for a in argv]


def _frames(tb) -> tuple[str, str]:
    """(last ddlsim frame, last frame) as 'path:line func'."""
    frames = traceback.extract_tb(tb)
    fmt = (lambda f: f"{os.path.relpath(f.filename, REPO) if f.filename.startswith(str(REPO)) else Path(f.filename).name}:{f.lineno} {f.name}")
    own = [f for f in frames if "/ddlsim/" in f.filename]
    return (fmt(own[-1]) if own else "-", fmt(frames[-1]) if frames else "-")


def _from_exception(exc: BaseException) -> dict:
    own, last = _frames(exc.__traceback__)
    try:  # the message may be huge (a repr of an alias bomb): never format all of it
        msg = str(exc)[:500]
    except Exception:  # noqa: BLE001
        msg = "<str() failed>"
    frames = traceback.format_list(traceback.extract_tb(exc.__traceback__)[-3:])
    tail = "".join(frames).splitlines() + [f"{type(exc).__name__}: {msg}"]
    outcome = "memory" if isinstance(exc, MemoryError) else "traceback"
    return {"outcome": outcome, "error": type(exc).__name__, "frame": own, "last": last,
            "tail": "\n".join(tail)}


_NONFINITE = re.compile(r"\b(NaN|-?Infinity|nan|-?inf)\b")


def _judged(exc: BaseException) -> dict:
    """The outcome of an exception the CLI would print as its ``error:`` paragraph (the
    worker runs it with ``DDLSIM_DEBUG=1``, so it arrives here whole)."""
    from ddlsim.errors import DDLSimError

    described = (isinstance(exc, OSError) and exc.strerror) or isinstance(
        exc, (UnicodeDecodeError, RecursionError))
    if isinstance(exc, DDLSimError) or described:
        text = str(exc)[:2000]
        if isinstance(exc, DDLSimError) and BARE.search(text):
            return {**_from_exception(exc), "outcome": "bare message"}
        return {"outcome": "clean error"}
    if isinstance(exc, (ValueError, OverflowError)) and not isinstance(exc, MemoryError):
        return {**_from_exception(exc), "outcome": "bare message"}
    return _from_exception(exc)


def _run_cli(argv: list[str]) -> dict:
    from typer.testing import CliRunner

    from ddlsim.cli import app
    res = CliRunner().invoke(app, argv)
    out = res.output
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return _judged(res.exception)
    lines = [ln.strip(" │╭╮╰╯─") for ln in out.splitlines()]
    differs = res.exit_code == 1 and "--diff-mpip" in argv  # a diff that found differences
    if res.exit_code == 0 or differs:
        return {"outcome": "ok", "nonfinite": argv[:1] == ["predict"] and bool(
            _NONFINITE.search(out))}
    # ddlsim's "error: …", click's usage error (an "Error" box) or the help of a bare group
    said = any(ln.lower().startswith("error") or ln.startswith("Usage:") for ln in lines)
    if res.exit_code == 2 and "Traceback" not in out and said:
        return {"outcome": "clean error"}
    first = next((ln for ln in lines if ln), "")
    return {"outcome": "traceback", "error": f"exit {res.exit_code}", "frame": first[:80],
            "last": "-", "tail": "\n".join(out.splitlines()[-8:])}


def _run_api(call: dict) -> dict:
    import ddlsim
    from ddlsim.calibration.readers import read_results
    from ddlsim.errors import DDLSimError

    fn = {"load_config": ddlsim.load_config, "predict": ddlsim.predict,
          "read_results": read_results,
          "sleep": time.sleep, "allocate": bytearray}[call["fn"]]  # the last two test the pool
    try:
        value = fn(*call["args"], **call["kwargs"])
        text = json.dumps(value.to_dict()) if hasattr(value, "to_dict") else (
            value.to_csv() if hasattr(value, "to_csv") else repr(value))
    except DDLSimError as exc:
        return _judged(exc)
    except Exception as exc:  # noqa: BLE001 - anything else is what we are looking for
        return _from_exception(exc)
    return {"outcome": "ok", "nonfinite": call["fn"] == "predict" and bool(
        _NONFINITE.search(text))}


def run_case(case: dict, scratch: str | None = None) -> dict:
    """Run one case in a fresh temporary directory (under ``scratch``), in this process."""
    old, tmp = os.getcwd(), tempfile.mkdtemp(prefix="case-", dir=scratch)
    t0 = time.perf_counter()
    try:
        os.chdir(tmp)
        if not _materialize(case):
            return {"outcome": "skipped", "seconds": 0.0}
        res = _run_cli(_resolve(case["argv"])) if "argv" in case else _run_api(case["api"])
    except MemoryError as exc:
        res = _from_exception(exc)
    finally:
        os.chdir(old)
        try:
            os.chmod(Path(tmp, "config.yaml"), 0o600, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = time.perf_counter() - t0
    return res


# ================================================================================= workers
def _worker(conn, mem_bytes: int, seed: int, scratch: str, rss_bytes: int = 0) -> None:
    import resource
    import warnings

    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    os.environ["DDLSIM_DEBUG"] = "1"  # errors arrive whole, to be judged (_judged)
    warnings.simplefilter("ignore")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    _warm()
    conn.send("ready")
    while True:
        msg = conn.recv()
        case = make_case(seed, msg) if isinstance(msg, int) else msg
        try:
            res = run_case(case, scratch)
        except BaseException as exc:  # noqa: BLE001
            res = _from_exception(exc)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        if rss_bytes and peak > rss_bytes and res["outcome"] != "memory":
            res = {"outcome": "memory", "error": f"peak RSS {peak / 2**30:.2f} GiB",
                   "frame": res["outcome"], "last": "-", "tail": "", "seconds": res.get("seconds")}
        conn.send(res)
        if res["outcome"] == "memory":
            return  # a fresh process for the next case


def _warm() -> None:
    """Import what cases use, so that no case's deadline pays for it (done in the parent
    too: forked workers then start warm)."""
    import matplotlib
    matplotlib.use("Agg")
    import typer.testing  # noqa: F401
    import ddlsim.api  # noqa: F401
    import ddlsim.calibration.build  # noqa: F401
    import ddlsim.calibration.readers  # noqa: F401
    import ddlsim.cli  # noqa: F401
    import ddlsim.report  # noqa: F401
    import ddlsim.simulator.des  # noqa: F401
    import ddlsim.topologies.build  # noqa: F401
    _bases()
    _saved_result()


class Pool:
    """``jobs`` worker processes, each with an address-space cap; a case past ``timeout``
    seconds has its worker killed and replaced."""

    def __init__(self, jobs: int = 2, timeout: float = 60, mem_gb: float = 1.5, seed: int = 0,
                 rss_gb: float = 0.0):
        self.timeout, self.mem, self.seed = timeout, int(mem_gb * 2**30), seed
        self.rss = int(rss_gb * 2**30)
        self.ctx = mp.get_context("fork")
        # case directories live here, so that those of killed workers are removed too
        self.scratch = tempfile.mkdtemp(prefix="ddlsim-fuzz-")
        _warm()
        self.slots = [self._start() for _ in range(jobs)]

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, daemon=True,
                                args=(child, self.mem, self.seed, self.scratch, self.rss))
        proc.start()
        child.close()
        if not parent.poll(120) or parent.recv() != "ready":
            raise RuntimeError("a fuzz worker did not start")
        return {"proc": proc, "conn": parent, "task": None, "deadline": 0.0}

    def _restart(self, slot: dict) -> None:
        slot["proc"].kill()
        slot["proc"].join()
        slot["conn"].close()
        slot.update(self._start())

    def run(self, tasks):
        """Yield ``(task, result)`` for every task (a case number or a case dict)."""
        todo = list(tasks)[::-1]
        while todo or any(s["task"] is not None for s in self.slots):
            for s in self.slots:
                if s["task"] is None and todo:
                    s["task"] = todo.pop()
                    s["deadline"] = time.monotonic() + self.timeout
                    s["conn"].send(s["task"])
            busy = [s for s in self.slots if s["task"] is not None]
            left = max(0.0, min(s["deadline"] for s in busy) - time.monotonic())
            ready = wait([s["conn"] for s in busy], timeout=left)
            for s in busy:
                task = s["task"]
                if s["conn"] in ready:
                    try:
                        res = s["conn"].recv()
                    except (EOFError, OSError):
                        code = s["proc"].exitcode
                        res = {"outcome": "memory" if code is None or code < 0 else "traceback",
                               "error": f"worker died (exit {code})", "frame": "-",
                               "last": "-", "tail": ""}
                    if res["outcome"] == "memory" or "worker died" in res.get("error", ""):
                        self._restart(s)
                elif time.monotonic() >= s["deadline"]:
                    res = {"outcome": "timeout", "seconds": self.timeout}
                    self._restart(s)
                else:
                    continue
                s["task"] = None
                yield task, res

    def close(self) -> None:
        for s in self.slots:
            s["proc"].kill()
            s["proc"].join()
        shutil.rmtree(self.scratch, ignore_errors=True)


# ================================================================================== report
def describe(case: dict, limit: int = 400) -> str:
    """The case as a person reads it: target, command or call, and each file's content."""
    lines = [f"[{case['target']}] {case['desc']}"]
    if "argv" in case:
        lines.append("$ ddlsim " + " ".join(
            a[1:] if a.startswith("@") else (a if a and " " not in a else repr(a))
            for a in map(str, case["argv"])))
    if case.get("special"):
        lines.append(f"special path: {case['special']}")
    for name, content in case.get("files", {}).items():
        if isinstance(content, tuple):
            body = f"<{content[1][:limit]!r} then {content[2]!r} × {content[3]:,}>"
        elif isinstance(content, bytes):
            try:
                body = content.decode("utf-8")
            except UnicodeDecodeError:
                body = repr(content[:limit])
        else:
            body = content
        body = body if len(body) <= limit else body[:limit] + f"\n…({len(body):,} chars)"
        lines.append(f"--- {name}\n{body}")
    if "api" in case:
        lines.append(f"call: {case['api']['fn']}(*{_short(case['api']['args'], limit)}, "
                     f"**{_short(case['api']['kwargs'])})")
    return "\n".join(lines)


def _group(case: dict, res: dict) -> str:
    if res["outcome"] == "timeout":
        return f"timeout in {case['target']}: {case['kind']}"
    return f"{res.get('error')} @ {res.get('frame')}"


def report(results: list[tuple[dict, dict]], show: int, elapsed: float) -> int:
    counts: dict = defaultdict(Counter)
    groups: dict = defaultdict(list)
    for case, res in results:
        counts[case["target"]][res["outcome"]] += 1
        counts[case["target"]]["nonfinite"] += bool(res.get("nonfinite"))
        counts[case["target"]]["ms"] += round(1000 * res.get("seconds", 0.0))
        if res["outcome"] in FAILURES:
            groups[(res["outcome"], _group(case, res))].append((case, res))
    cols = OUTCOMES + (("skipped",) if any(c["skipped"] for c in counts.values()) else ())
    head = f"{'target':<12}" + "".join(f"{c:>13}" for c in cols) + f"{'total':>8}"
    print(head + "  mean ms  (ok with NaN/inf in output)\n" + "-" * len(head))
    total: Counter = Counter()
    for t in list(TARGETS) + ["total"]:
        row = total if t == "total" else counts.get(t)
        if row is None:
            continue
        if t != "total":
            total.update(row)
        n = sum(row[c] for c in cols)
        print(f"{t:<12}" + "".join(f"{row[c]:>13}" for c in cols) + f"{n:>8}"
              f"{row['ms'] / max(n, 1):>9.0f}  ({row['nonfinite']})")
    print(f"\n{sum(total[c] for c in cols)} cases in {elapsed:.1f} s")
    odd = [str(c["k"]) for c, r in results if r.get("nonfinite") and "k" in c]
    if odd:
        print(f"ok, but NaN/Infinity in the output: cases {', '.join(odd[:20])}")
    for (outcome, key), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        items.sort(key=lambda cr: len(describe(cr[0], 10**9)))
        nums = ", ".join(str(c["k"]) for c, _ in items[:12] if "k" in c)
        print(f"\n=== {outcome}: {key}  ({len(items)} cases: {nums}{' …' if len(items) > 12 else ''})")
        for case, res in items[:show]:
            print(f"--- case {case.get('k')}  ({res.get('seconds', 0):.2f} s)")
            print(describe(case))
            if res.get("tail"):
                print("  > " + res["tail"].replace("\n", "\n  > "))
    bad = sum(total[o] for o in FAILURES)
    return 1 if bad else 0


def _selected(seed: int, n: int, only: set[str] | None):
    k = 0
    while n:
        case = make_case(seed, k)
        if only is None or case["target"] in only:
            yield case
            n -= 1
        k += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--mem-gb", type=float, default=1.5, help="address-space cap per worker")
    ap.add_argument("--rss-gb", type=float, default=1.0,
                    help="a case whose worker's peak resident set passes this is 'memory'")
    ap.add_argument("--only", help=f"comma-separated targets: {', '.join(TARGETS)}")
    ap.add_argument("--show", type=int, default=3, help="examples printed per failure class")
    ap.add_argument("--case", type=int, help="replay case K: print its input and outcome")
    ap.add_argument("--keep", type=Path, help="with --case: also write its files into KEEP")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    if args.case is not None:
        return _replay(args)
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(TARGETS):
        ap.error(f"--only: unknown target(s) {sorted(only - set(TARGETS))}; allowed: {list(TARGETS)}")
    t0 = time.perf_counter()
    cases = {c["k"]: c for c in _selected(args.seed, args.cases, only)}
    pool = Pool(args.jobs, args.timeout, args.mem_gb, args.seed, args.rss_gb)
    results, step = [], max(1, args.cases // 20)
    try:
        for k, res in pool.run(sorted(cases)):
            results.append((cases[k], res))
            if len(results) % step == 0:
                print(f"  {len(results)}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    finally:
        pool.close()
    return report(results, args.show, time.perf_counter() - t0)


def _replay(args) -> int:
    case = make_case(args.seed, args.case)
    print(describe(case, 10**9 if args.keep else 4000))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        here = os.getcwd()
        os.chdir(args.keep)
        try:
            _materialize(case)
        finally:
            os.chdir(here)
        print(f"(files written to {args.keep})")
    pool = Pool(1, args.timeout, args.mem_gb, args.seed, args.rss_gb)
    try:
        (_, res), = pool.run([case])
    finally:
        pool.close()
    print(f"\noutcome: {res['outcome']} ({res.get('seconds', 0):.2f} s)")
    if res.get("tail"):
        print(res["tail"])
    return 1 if res["outcome"] in FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
