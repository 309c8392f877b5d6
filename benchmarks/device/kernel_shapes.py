"""The GEMM and attention shapes ddlsim emits for the public runs it is validated on.

Run:  python benchmarks/device/kernel_shapes.py > benchmarks/device/kernel_shapes.json

It builds the workload of every row of ``validate_megatron.py`` (A100, 2021) and
``validate_h100.py`` (H100, NeMo 24.07) and writes, once each, the GEMM kernels
``(M, N, K, batch, dtype)`` of their compute ops and the attention cores
``(b, heads, s, d, kv_heads)`` of their layers. ``h100_kernels.py`` times exactly these shapes
on a GPU, so the kernel model is checked on the shapes it is used for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ddlsim  # noqa: E402
from ddlsim.workloads.trace import Compute  # noqa: E402

import validate_h100  # noqa: E402
import validate_megatron  # noqa: E402


def _gemms(config: dict) -> set[tuple]:
    cfg = ddlsim.load_config(config)
    out = set()
    for rank_class in ddlsim.build_workload(cfg).classes:
        for block in rank_class.program.blocks.values():
            for op in block.flat.ops:
                p = op.payload
                if isinstance(p, Compute) and p.kernels:
                    out.update((*map(int, k.shape), int(k.batch), k.dtype)
                               for k in p.kernels if k.kind == "gemm")
    return out


def _attention(config: dict) -> tuple:
    m, par, tr = config["model"], config["parallel"], config["train"]
    tp = par.get("tensor_model_parallel_size", 1)
    cp = par.get("context_parallel_size", 1)
    heads = m["num_attention_heads"]
    kv = m.get("num_key_value_heads", heads)
    return (int(tr["micro_batch_size"]), heads // tp, int(tr["seq_length"]) // cp,
            m["hidden_size"] // heads, max(1, kv // tp))


def main() -> int:
    cases = [("megatron-sc21", validate_megatron.config(r)) for r in validate_megatron.rows()]
    cases += [("nemo-h100", validate_h100.config(r)) for r in validate_h100.rows()]
    gemms: dict[tuple, list[str]] = {}
    attention: dict[tuple, list[str]] = {}
    for source, config in cases:
        name = f"{source}:{config['model']['name']}"
        for g in sorted(_gemms(config)):
            gemms.setdefault(g, []).append(name)
        attention.setdefault(_attention(config), []).append(name)
    json.dump({"gemm": [{"m": g[0], "n": g[1], "k": g[2], "batch": g[3], "dtype": g[4],
                         "cases": sorted(set(c))} for g, c in sorted(gemms.items())],
               "attention": [{"b": a[0], "heads": a[1], "seq": a[2], "head_dim": a[3],
                              "kv_heads": a[4], "cases": sorted(set(c))}
                             for a, c in sorted(attention.items())]},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
