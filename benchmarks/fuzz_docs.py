"""The fuzzer's mutations of run configs (``benchmarks/fuzz.py``): the example and preset
documents it starts from, bad values and sections, typos, cross-field scenarios, and the
text-level tricks (YAML tokens, alias bombs, encodings, dropped sections) of a config file.
Each function draws from the ``random.Random`` it is given, so a case is a function of its
seed alone.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
SMALL = [e for e in EXAMPLES if e.startswith(("wiki", "gpt2"))]


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
