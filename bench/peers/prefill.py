#!/usr/bin/env python3
"""Prefill of one sequence with transformers' Qwen2ForCausalLM (random weights, bf16, SDPA
attention): the peer for `swerve-bench prefill`. Timed per run: the base model (all layers and the
final norm) over the whole sequence, then the LM head on the last token's hidden state only (what
serving computes; never the full [T, V] logits). Same FLOP count and key strings as swerve-bench.

    python3 prefill.py [--jsonl PATH] [--preset qwen2.5-7b] [--seq-lens 4096,16384,32768] [--reps 3]
    python3 prefill.py --device cpu --smoke        # code-path check, no GPU: 2 layers, short lengths
"""

import argparse
import gc
import sys

import torch

from common import Records, add_common_args, is_oom, short, time_median, torch_device

# Qwen2.5 shapes; weights are random (no download). rope_theta 1e6, rms_norm_eps 1e-6, context 32768.
PRESETS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False),
}
SMOKE_LAYERS = 2
SMOKE_SEQ_LENS = [128, 256]


def prefill_flops(p, seq_len):
    """The formula swerve-bench uses (bench::prefill_flops, tp 1): every GEMM, causal attention
    (QK^T and PV over the lower triangle), the LM head for the last token only."""
    t = float(seq_len)
    d = p["hidden_size"]
    hd = d // p["num_attention_heads"]
    q = p["num_attention_heads"] * hd
    kv = p["num_key_value_heads"] * hd
    inter = p["intermediate_size"]
    gemm_per_token = 2.0 * (d * q + 2.0 * d * kv + q * d + 3.0 * d * inter)
    attention = 2.0 * 2.0 * q * t * (t + 1.0) / 2.0
    return p["num_hidden_layers"] * (gemm_per_token * t + attention) + 2.0 * d * p["vocab_size"]


def build_model(p, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **p,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        use_cache=False,
        attn_implementation="sdpa",
    )
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters are created (and initialised) in bf16 ...
    try:
        with device:  # ... directly on the device: no fp32 copy on the host
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    dtypes = {param.dtype for param in model.parameters()}
    if dtypes != {torch.bfloat16}:
        raise SystemExit(f"expected bf16 parameters, got {dtypes}")
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--preset", default="qwen2.5-7b", choices=sorted(PRESETS))
    parser.add_argument("--seq-lens", default=None, help="comma-separated (default 4096,16384,32768)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="timed runs per length; the median is reported")
    args = parser.parse_args()

    if args.seq_lens:
        seq_lens = [int(n) for n in args.seq_lens.split(",") if n.strip()]
    else:
        seq_lens = SMOKE_SEQ_LENS if args.smoke else [4096, 16384, 32768]
    if not seq_lens or min(seq_lens) <= 0 or max(seq_lens) > 32768:
        parser.error("--seq-lens needs lengths in 1..32768 (the model's context)")

    import transformers

    device = torch_device(torch, args.device)
    p = dict(PRESETS[args.preset])
    note = None
    if args.smoke:
        p["num_hidden_layers"] = SMOKE_LAYERS
        note = f"smoke: {SMOKE_LAYERS} layers"
        args.reps = min(args.reps, 2)

    records = Records(args.jsonl)
    model = build_model(p, device)
    attn = model.config._attn_implementation
    attn_class = type(model.model.layers[0].self_attn).__name__
    if attn != "sdpa":
        raise SystemExit(f"transformers chose attention implementation {attn!r}, not sdpa")
    name = records.device(torch, device, "transformers-sdpa",
                          note=f"transformers {transformers.__version__}, attention {attn} ({attn_class})")
    print(f"device: {name}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"model: transformers Qwen2ForCausalLM, preset {args.preset} ({p['num_hidden_layers']} layers, "
          f"hidden {p['hidden_size']}, heads {p['num_attention_heads']}/{p['num_key_value_heads']} kv, "
          f"vocab {p['vocab_size']}), random weights, bf16, attention {attn} ({attn_class})")
    print(f"one sequence; base model + LM head on the last token; median of {args.reps} after {args.warmup} warm-up")
    print(f"{'tokens':>9} {'median ms':>12} {'tokens/s':>12} {'TFLOP/s':>10}  note")

    vocab = p["vocab_size"]
    for seq_len in seq_lens:
        key = f"preset={args.preset} len={seq_len}"
        record = {"table": "prefill", "impl": "transformers-sdpa", "key": key}
        ids = torch.tensor([[(i * 2654435761 + 12345) % vocab for i in range(seq_len)]], dtype=torch.long, device=device)

        def run():
            hidden = model.model(input_ids=ids, use_cache=False)[0]
            return model.lm_head(hidden[:, -1:, :])

        error = None
        try:
            with torch.inference_mode():
                median = time_median(torch, device, run, args.warmup, args.reps)
        except Exception as err:  # out of memory: skip this length, keep going
            if not is_oom(err, torch):
                raise
            error = short(err)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if error:
            record.update({"median_ms": None, "tflops": None, "tokens_per_s": None, "note": "skipped: " + error})
            print(f"{seq_len:>9} {'-':>12} {'-':>12} {'-':>10}  {record['note']}")
        else:
            tokens_per_s = seq_len / (median * 1e-3)
            tflops = prefill_flops(p, seq_len) / (median * 1e-3) / 1e12
            record.update({"median_ms": median, "tflops": tflops, "tokens_per_s": tokens_per_s})
            if note:
                record["note"] = note
            print(f"{seq_len:>9} {median:>12.2f} {tokens_per_s:>12.0f} {tflops:>10.4f}  {note or ''}")
        records.write(record)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
