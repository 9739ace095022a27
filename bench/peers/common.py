"""Shared by the peer benchmarks: timing, the JSONL records, the device header.

Records are one JSON object per line, appended to the file given by --jsonl; swerve-bench writes
the same schema for its own rows (see README.md), and compare.py reads both.
"""

import json
import statistics
import time


def add_common_args(parser):
    parser.add_argument("--jsonl", help="append one JSON record per row to this file")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda; cpu for --smoke checks)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, to check the code path (e.g. on a CPU); numbers mean nothing")


def torch_device(torch, name):
    """The torch device, or exit with the reason when it is a GPU that is not there."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"no CUDA device visible to torch {torch.__version__} (use --device cpu --smoke to check the code path)")
    return device


def time_median(torch, device, fn, warmup, reps):
    """Median milliseconds of `reps` calls of fn after `warmup` calls. CUDA events on a GPU,
    the host clock (after a synchronize, where there is one) otherwise."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class Records:
    """Appends records to the --jsonl file (if any), one line each, flushed as they come so that a
    run killed part-way keeps what it measured."""

    def __init__(self, path):
        self.file = open(path, "a") if path else None

    def write(self, record):
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def device(self, torch, device, impl, note=None):
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
        else:
            name = str(device)
        record = {"table": "device", "impl": impl, "name": name, "torch": torch.__version__}
        if note:
            record["note"] = note
        self.write(record)
        return name


def is_oom(err, torch):
    oom = getattr(torch.cuda, "OutOfMemoryError", None) or getattr(torch, "OutOfMemoryError", None)
    return (oom is not None and isinstance(err, oom)) or "out of memory" in str(err).lower()


def short(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]
