"""Time one training step of a Llama 3.1 8B prefix on one GPU, as torchtitan runs it: the
ground truth for ddlsim's per-GPU compute of a today's-stack (FSDP2) step (issues 29 and 30), a
microbenchmark, no ddlsim needed.

Run on a machine with a CUDA GPU and PyTorch >= 2.6:

    python benchmarks/device/llama_step.py --out OUTDIR [--layers 8] [--seq 8192] [--steps 8]

The model is torchtitan's Llama 3 (``torchtitan/models/llama3/model/model.py`` at pytorch/torchtitan
07c00d9, the commit ``examples/llama3-8b-fsdp2-h100.yaml`` cites) with Llama 3.1 8B's shapes
(dim 4096, 32 heads, 8 KV heads, FFN 14336, vocabulary 128256, RoPE theta 5e5) and ``--layers``
of its 32 blocks: token embedding, per block ``nn.RMSNorm``, separate ``wq``/``wk``/``wv``/``wo``
linears, complex RoPE, ``repeat_kv``, causal ``scaled_dot_product_attention`` (FlashAttention, as
torchtitan's default SDPA picks it), SwiGLU ``w2(silu(w1 x) * w3 x)``; the final norm, the output
linear and the fp32 cross-entropy of torchtitan's ``cross_entropy_loss``. Parallelism as
torchtitan applies it on one GPU under ``data_parallel_shard_degree`` 1 with FSDP forced on:
``fully_shard`` per block and on the root (a mesh of one rank, NCCL), ``MixedPrecisionPolicy``
with bf16 parameters and fp32 reductions, ``reshard_after_forward`` true; the optimizer
torchtitan's default, ``AdamW(lr=8e-4, weight_decay=0.1, fused=True)``.

Variants (``--variants``), each ``--steps`` timed steps after 3 warm-ups (the median step, and the
median forward, backward and optimizer step between CUDA events):

* ``none`` — no activation checkpointing;
* ``selective_op`` — torchtitan's ``selective_ac_option: 'op'`` (``_apply_ac_to_transformer_block``):
  per block, save the outputs of SDPA and of every second ``aten.mm``, recompute the rest;
* ``full`` — torchtitan's ``mode: 'full'``: each block checkpointed whole;
* ``compile_selective_op`` — ``selective_op`` with each block ``torch.compile``'d as torchtitan's
  ``compile.enable`` does (per block, ``fullgraph=True``), if it compiles within the time left.

It writes ``OUTDIR/llama_step.json``: the environment (GPU, clocks, versions), and per variant the
step, forward, backward and optimizer seconds (median and all samples), the tokens per second, the
peak allocated and reserved memory, and the model's FLOPs per step counted from its shapes (no
attention-mask discount), and ``OUTDIR/llama_step_trace.json.gz``: the PyTorch profiler (Kineto)
trace of one ``selective_op`` step (``--trace-variant``), for ``ddlsim`` trace import, and the
memory snapshot's peak: ``peak_allocated_GiB`` per phase of that step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Llama 3.1 8B (meta-llama/Llama-3.1-8B config.json; torchtitan's llama3_configs["8B"])
DIM, HEADS, KV_HEADS, FFN, VOCAB, THETA, EPS = 4096, 32, 8, 14336, 128256, 500000.0, 1e-5


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(t, freqs).float())


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * fc).flatten(3)
    xk_out = torch.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        rep = HEADS // KV_HEADS
        xq, xk, xv = (t.transpose(1, 2) for t in (xq, repeat_kv(xk, rep), repeat_kv(xv, rep)))
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = Attention(), FeedForward()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM, eps=EPS), nn.RMSNorm(DIM, eps=EPS)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, layers: int, seq: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM, eps=EPS)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(DIM // HEADS, seq, THETA),
                             persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def selective_op_policy():
    """torchtitan's op-level SAC policy: save SDPA's outputs and every second mm's."""
    from torch.utils.checkpoint import CheckpointPolicy
    save = {torch.ops.aten.mm.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten.max.default}
    if hasattr(torch.ops, "_c10d_functional"):     # async TP's reduce-scatter, as torchtitan lists
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    for name in ("_scaled_dot_product_cudnn_attention",):
        if hasattr(torch.ops.aten, name):
            save.add(getattr(torch.ops.aten, name).default)

    def context_fn():
        from torch.utils.checkpoint import create_selective_checkpoint_contexts
        meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

        def policy(ctx, func, *args, **kwargs):
            key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
            if func == torch.ops.aten.mm.default:
                meta[key] += 1
            keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context_fn


def build(layers: int, seq: int, variant: str, device: str):
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(layers, seq)
    ac = variant.replace("compile_", "")
    for name, block in list(model.layers.items()):
        if ac == "full":
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        elif ac == "selective_op":
            block = checkpoint_wrapper(block, context_fn=selective_op_policy(),
                                       preserve_rng_state=False)
        if variant.startswith("compile_"):
            block = torch.compile(block, fullgraph=True)
        model.layers.register_module(name, block)
    mesh = init_device_mesh(device, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        model.freqs_cis = precompute_freqs_cis(DIM // HEADS, seq, THETA).to(device)
    for m in model.modules():
        if isinstance(m, nn.RMSNorm):
            with torch.no_grad():
                m.weight.fill_(1.0)
    fused = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=fused, foreach=not fused)
    return model, opt


def flops_per_step(layers: int, seq: int, batch: int) -> float:
    """Model FLOPs of one step counted from the shapes: 6 per parameter-token for every linear
    (and the output), attention scores and context 4·s²·dim per layer forward, times 3."""
    hd = DIM // HEADS
    linear = DIM * (HEADS * hd + 2 * KV_HEADS * hd + HEADS * hd) + 3 * DIM * FFN
    tokens = batch * seq
    dense = 6 * tokens * (layers * linear + DIM * VOCAB)
    attn = 3 * layers * 4 * batch * seq * seq * DIM
    return float(dense + attn)


def run_variant(variant, args, device, sync, out):
    model, opt = build(args.layers, args.seq, variant, device)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq), device=device)
    labels = torch.randint(0, VOCAB, (args.batch, args.seq), device=device)
    timing = device == "cuda"

    def ev():
        return torch.cuda.Event(enable_timing=True) if timing else None

    def step(record=None):
        e = [ev() for _ in range(4)]
        if timing:
            e[0].record()
        pred = model(tokens)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        if timing:
            e[1].record()
        loss.backward()
        if timing:
            e[2].record()
        opt.step()
        opt.zero_grad()
        if timing:
            e[3].record()
        return e

    t_build = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    warm_s = time.perf_counter() - t_build
    if timing:
        torch.cuda.reset_peak_memory_stats()
    samples, parts = [], []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        e = step()
        sync()
        samples.append(time.perf_counter() - t0)
        if timing:
            parts.append([e[i].elapsed_time(e[i + 1]) / 1e3 for i in range(3)])
    res = {"variant": variant, "warmup_s": warm_s, "step_s": statistics.median(samples),
           "step_samples_s": samples}
    if timing:
        for j, name in enumerate(("forward_s", "backward_s", "optimizer_s")):
            res[name] = statistics.median(p[j] for p in parts)
        res["peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2 ** 30
        res["peak_reserved_GiB"] = torch.cuda.max_memory_reserved() / 2 ** 30
    if timing:   # one more step, the peak allocated memory per phase
        phases = {}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        pred = model(tokens)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        torch.cuda.synchronize()
        phases["forward"] = torch.cuda.max_memory_allocated() / 2 ** 30
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.cuda.synchronize()
        phases["backward"] = torch.cuda.max_memory_allocated() / 2 ** 30
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        phases["optimizer"] = torch.cuda.max_memory_allocated() / 2 ** 30
        res["peak_allocated_by_phase_GiB"] = phases
    fl = flops_per_step(args.layers, args.seq, args.batch)
    res.update(model_flops=fl, tflops_per_s=fl / res["step_s"] / 1e12,
               tokens_per_s=args.batch * args.seq / res["step_s"])
    if variant == args.trace_variant and args.trace:
        from h100_kernels import profiled_step
        profiled_step(step, os.path.join(args.out, "llama_step_trace.json.gz"), timing)
    del model, opt
    gc.collect()     # FSDP2's hooks hold the model in reference cycles: free it before the next
    if timing:       # variant, or that variant's peak memory counts this one's parameters
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--variants", default="none,selective_op,full,compile_selective_op")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="skip a variant once this many seconds have passed")
    ap.add_argument("--no-trace", dest="trace", action="store_false")
    ap.add_argument("--trace-variant", default="selective_op",
                    help="the variant whose step is traced (default selective_op)")
    ap.add_argument("--tiny", action="store_true",
                    help="a dry run of the code path at toy sizes (any device)")
    args = ap.parse_args()
    if args.tiny:
        global DIM, HEADS, KV_HEADS, FFN, VOCAB
        DIM, HEADS, KV_HEADS, FFN, VOCAB = 64, 4, 2, 128, 256
    os.makedirs(args.out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from h100_kernels import env
    result = {"env": env(device), "layers": args.layers, "seq": args.seq, "batch": args.batch,
              "steps": args.steps, "variants": []}
    path = os.path.join(args.out, "llama_step.json")
    t_start = time.perf_counter()
    for variant in args.variants.split(","):
        if time.perf_counter() - t_start > args.budget_s:
            result["variants"].append({"variant": variant, "skipped": "time budget"})
            continue
        try:
            res = run_variant(variant, args, device, sync, args.out)
        except Exception as exc:  # noqa: BLE001 - keep what was measured
            res = {"variant": variant, "error": repr(exc)[:500]}
            if device == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps(res), flush=True)
        result["variants"].append(res)
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
