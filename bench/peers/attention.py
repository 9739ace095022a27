#!/usr/bin/env python3
"""Causal attention forward and backward with PyTorch SDPA, bf16, per backend (flash, cuDNN): the
peer for swerve's attention kernels. Same shapes, key strings and FLOP convention as swerve-bench:
forward rows in table "attention", backward rows (dQ, dK, dV from a saved forward, 2.5x the
forward's FLOPs) in table "attention_bwd".

    python3 attention.py [--jsonl PATH] [--backends flash,cudnn] [--passes fwd,bwd] [--reps 20]
    python3 attention.py --device cpu --smoke --backends flash,math   # code-path check, no GPU
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from common import Records, add_common_args, is_oom, short, time_median, torch_device

# (seqs, len, query heads, kv heads, head_dim); the key strings must match swerve-bench's.
SHAPES = [
    (1, 8192, 28, 4, 128),
    (1, 16384, 28, 4, 128),
    (1, 16384, 32, 8, 128),
    (4, 4096, 28, 4, 128),
    (1, 8192, 14, 2, 64),
    (1, 4096, 28, 4, 128),
    (1, 32768, 28, 4, 128),
    (1, 131072, 28, 4, 128),
]
# The backward is timed at swerve-bench's backward shapes (causal, d 128, GQA 28/4, 8k and 16k).
BWD_SHAPES = [
    (1, 8192, 28, 4, 128),
    (1, 16384, 28, 4, 128),
]
SMOKE_DIVISOR = 32  # --smoke: lengths / 32 (256..512), so the keys stay distinct

# name -> (impl string in the records, SDPBackend member name)
BACKENDS = {
    "flash": ("sdpa-flash", "FLASH_ATTENTION"),
    "cudnn": ("sdpa-cudnn", "CUDNN_ATTENTION"),
    "efficient": ("sdpa-efficient", "EFFICIENT_ATTENTION"),
    "math": ("sdpa-math", "MATH"),  # --smoke only: exercises the code path where flash/cuDNN are absent
}


def key(seqs, length, heads, kv_heads, d):
    return f"seqs={seqs} len={length} heads={heads}/{kv_heads} d={d}"


def flops(seqs, length, heads, d):
    # FlashAttention's convention: QK^T and PV, 2 FLOPs per multiply-add, causal halves.
    return 4 * seqs * length * length * heads * d / 2


BWD_FLOPS_FACTOR = 2.5  # the backward's five products against the forward's two


def measure(torch, F, backend, sdpa_kernel, device, q, k, v, heads, kv_heads, passname, args):
    """(median ms, note, errors) of one pass at one shape: native GQA first; if the backend refuses
    it, K/V repeated to every query head (outside the timed region; the backward then leaves the
    group sum of dK/dV out, which swerve's kernel includes)."""
    errors = []
    for mode in ("gqa", "repeat"):
        if mode == "gqa":
            kk, vv, extra = k, v, {"enable_gqa": True}
        else:
            group = heads // kv_heads
            kk, vv, extra = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), {}
        if passname == "bwd":
            qq = q.detach().requires_grad_()
            kk, vv = kk.detach().requires_grad_(), vv.detach().requires_grad_()
        try:
            with sdpa_kernel(backend):
                if passname == "fwd":
                    run = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **extra)
                    out = run()
                    if not torch.isfinite(out).all():
                        raise RuntimeError("non-finite output")
                else:
                    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, **extra)
                    d_out = torch.randn_like(out)
                    run = lambda: torch.autograd.grad(out, (qq, kk, vv), d_out, retain_graph=True)
                    grads = run()
                    if not all(torch.isfinite(g).all() for g in grads):
                        raise RuntimeError("non-finite gradient")
                    del grads
                median = time_median(torch, device, run, args.warmup, args.reps)
            note = None
            if mode == "repeat":
                note = f"enable_gqa failed ({errors[0]}); K/V repeat_interleave'd to {heads} heads outside the timed region"
            return median, note, errors
        except TypeError as err:  # a torch without enable_gqa
            errors.append(short(err))
        except RuntimeError as err:
            errors.append(short(err))
            if is_oom(err, torch):
                break
        finally:
            del kk, vv
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return None, None, errors


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--backends", default="flash,cudnn", help="comma-separated: flash, cudnn, efficient (math with --smoke)")
    parser.add_argument("--passes", default="fwd,bwd", help="comma-separated: fwd (table attention), bwd (table attention_bwd)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as err:
        print(f"skipped: torch {torch.__version__} has no torch.nn.attention.sdpa_kernel ({err})")
        return 0

    device = torch_device(torch, args.device)
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in names:
        if name not in BACKENDS or (name == "math" and not args.smoke):
            parser.error(f"unknown backend {name!r} (flash, cudnn, efficient; math only with --smoke)")

    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    for p in passes:
        if p not in ("fwd", "bwd"):
            parser.error(f"unknown pass {p!r} (fwd, bwd)")
    plan = [("fwd", "attention", SHAPES, 1.0), ("bwd", "attention_bwd", BWD_SHAPES, BWD_FLOPS_FACTOR)]
    if args.smoke:
        plan = [(p, t, [(s, n // SMOKE_DIVISOR, h, kv, d) for (s, n, h, kv, d) in shapes], f) for (p, t, shapes, f) in plan]
        args.warmup, args.reps = min(args.warmup, 1), min(args.reps, 3)

    records = Records(args.jsonl)
    gen = torch.Generator(device=device)
    gen.manual_seed(0x5EED)
    dtype = torch.bfloat16

    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else device}, torch {torch.__version__}")
    print(f"causal attention, bf16, [batch, heads, seq, head_dim]; median of {args.reps} after {args.warmup} warm-up")
    print(f"{'impl':<15} {'pass':<4} {'key':<38} {'median ms':>10} {'TFLOP/s':>9}  note")
    for name in names:
        impl, member = BACKENDS[name]
        backend = getattr(SDPBackend, member, None)
        if backend is None:
            print(f"{impl:<15} skipped: this torch has no SDPBackend.{member}")
            continue
        records.device(torch, device, impl)
        for passname, table, shapes, factor in plan:
            if passname not in passes:
                continue
            for seqs, length, heads, kv_heads, d in shapes:
                k_str = key(seqs, length, heads, kv_heads, d)
                record = {"table": table, "impl": impl, "key": k_str}
                q = torch.randn(seqs, heads, length, d, device=device, dtype=dtype, generator=gen)
                k = torch.randn(seqs, kv_heads, length, d, device=device, dtype=dtype, generator=gen)
                v = torch.randn(seqs, kv_heads, length, d, device=device, dtype=dtype, generator=gen)
                median, note, errors = measure(torch, F, backend, sdpa_kernel, device, q, k, v, heads, kv_heads, passname, args)
                if median is None:
                    record.update({"median_ms": None, "tflops": None, "note": "skipped: " + "; ".join(dict.fromkeys(errors))})
                    print(f"{impl:<15} {passname:<4} {k_str:<38} {'-':>10} {'-':>9}  {record['note']}")
                else:
                    tflops = factor * flops(seqs, length, heads, d) / (median * 1e-3) / 1e12
                    record.update({"median_ms": median, "tflops": tflops})
                    if note:
                        record["note"] = note
                    print(f"{impl:<15} {passname:<4} {k_str:<38} {median:>10.3f} {tflops:>9.1f}  {note or ''}")
                records.write(record)
                del q, k, v
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
