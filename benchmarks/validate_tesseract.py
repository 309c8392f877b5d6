"""The seed's SUMMA2.5-LM comparison: 2.5-D [4,4,4] against 2-D [8,8,1] on 64 GPUs.

Run:  python benchmarks/validate_tesseract.py [--markdown]

The seed (the abstract of Wang et al. 2021, "2.5-dimensional distributed model training",
later Tesseract, arXiv:2105.14500) reports that 2.5-D [4,4,4] reaches 1.45× the weak-scaling
efficiency of 2-D [8,8,1]. It states no system, model width, batch or sequence. Both
arrangements use 64 GPUs; for the same per-GPU problem at the same GPU count, the ratio of
weak-scaling efficiencies is the ratio of throughputs, i.e. the 2-D iteration time over the
2.5-D one. This script predicts that ratio for what the seed leaves open, swept rather than
guessed: two layer widths (GPT-3's h = 12288, and h = 4096), two node sizes (8 and 4 A100 per
node, 200 Gb/s HDR per GPU), both engines. The same micro-batch (16, a multiple of both grids'
rows), sequence 2,048, 4 layers, full recomputation, bf16.
"""

from __future__ import annotations

import argparse
import warnings

import ddlsim

WIDTHS = {"h12288 (GPT-3)": {"preset": "gpt3-175b", "num_hidden_layers": 4},
          "h4096": {"architecture": "gpt", "num_hidden_layers": 4, "hidden_size": 4096,
                    "num_attention_heads": 32, "vocab_size": 50304,
                    "max_position_embeddings": 2048}}
NODES = {"8 GPUs/node": {"nodes": 8},
         "4 GPUs/node": {"nodes": 16, "devices_per_node": 4, "nics_per_node": 4}}
GRIDS = {"2-D [8,8,1]": {"mode": "2d", "q": 8}, "2.5-D [4,4,4]": {"mode": "2.5d", "q": 4, "d": 4}}


def predict(model: dict, nodes: dict, grid: dict, engine: str) -> float:
    cfg = {"model": model, "parallel": {"tensor_parallel": grid},
           "train": {"micro_batch_size": 16, "global_batch_size": 16, "seq_length": 2048,
                     "recompute": "full"},
           "system": {"preset": "dgx-a100", **nodes}}
    return ddlsim.predict(cfg, engine=engine, check_fit=False).iteration_time_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    if args.markdown:
        print("| layers | nodes | engine | 2-D [8,8,1] (s) | 2.5-D [4,4,4] (s) | ratio |")
        print("|---|---|---|---|---|---|")
    for wname, model in WIDTHS.items():
        for nname, nodes in NODES.items():
            for engine in ("analytical", "des"):
                two, two5 = (predict(model, nodes, g, engine) for g in GRIDS.values())
                cells = (wname, nname, engine, f"{two:.3f}", f"{two5:.3f}", f"{two / two5:.2f}")
                print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))


if __name__ == "__main__":
    main()
