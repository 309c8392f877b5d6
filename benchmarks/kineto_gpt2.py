"""Profile training steps of a small GPT-2 with the PyTorch profiler (Kineto), on CPU.

Writes the Chrome/Kineto JSON trace of one step and the measured wall time of every timed
step, so ``ddlsim traces kineto`` can be checked against a real profile (docs/traces.md):

    python benchmarks/kineto_gpt2.py --out tests/traces/data/gpt2_tiny_dp1.json
    python benchmarks/kineto_gpt2.py --ranks 2 --out dp2.json     # DDP over Gloo, 2 processes

The model is nanoGPT's / HuggingFace GPT-2's shape (pre-LayerNorm blocks of causal
self-attention and a GeLU MLP, learned positions, tied embeddings), written here in plain
PyTorch so that the module names (``transformer.h.N.attn``, ``…mlp``) are GPT-2's. Every
process runs one thread (``torch.set_num_threads(1)``), so a rank is one core.
Needs ``pip install 'ddlsim[torch]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, seq: int):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(seq, d),
            h=nn.ModuleList(Block(d, heads) for _ in range(layers)), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _run(rank: int, args) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.ranks > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=args.ranks)
    model = GPT(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    if args.ranks > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randint(args.vocab, (args.batch, args.seq))
    y = torch.randint(args.vocab, (args.batch, args.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        if args.ranks > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if args.ranks > 1:
        torch.distributed.barrier()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  with_stack=True, record_shapes=False)
    with prof:
        step()
    if rank == 0:
        prof.export_chrome_trace(args.out)
        summary = {"step_seconds": times, "median_s": statistics.median(times),
                   "ranks": args.ranks, "torch": torch.__version__, "config": vars(args)}
        with open(args.out + ".steps.json", "w") as f:
            json.dump(summary, f, indent=1)
        print(f"{args.ranks} rank(s): median step {statistics.median(times) * 1e3:.2f} ms "
              f"over {len(times)} steps; trace {args.out}")
    if args.ranks > 1:
        torch.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.ranks > 1:
        torch.multiprocessing.spawn(_run, args=(args,), nprocs=args.ranks)
    else:
        _run(0, args)


if __name__ == "__main__":
    main()
