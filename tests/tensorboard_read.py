"""Reads a run's OUT/tb/ with TensorBoard's own reader and checks it against the run's JSON lines.

    python3 tests/tensorboard_read.py OUT

For every line of OUT/iterations.jsonl and OUT/metrics.jsonl (those that exist), every numeric
leaf (booleans as 1 and 0) but the line's step key must be a scalar tagged FILE/KEY[/SUBKEY...]
at that step with the same value in float32, once; and TensorBoard must hold no other scalar.
Every event file must start with the file_version event "brain.Event:2". Exits non-zero naming
the first difference; prints "checks passed" at the end.
"""

import json
import math
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

STEP_KEYS = {"iterations": "iteration", "metrics": "step"}


def flatten(tag, value, out):
    """(tag, value) for every numeric leaf under `value` (tags joined with '/')."""
    if isinstance(value, bool):
        out.append((tag, 1.0 if value else 0.0))
    elif isinstance(value, (int, float)):
        out.append((tag, float(value)))
    elif isinstance(value, dict):
        for key, inner in value.items():
            flatten(f"{tag}/{key}", inner, out)
    # strings, lists and nulls are not scalars


def expected_scalars(out_dir):
    """{tag: [(step, float32 value), ...]} from the run's JSON lines."""
    expected = {}
    lines_read = 0
    for name, step_key in STEP_KEYS.items():
        path = os.path.join(out_dir, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for number, text in enumerate(f, 1):
                line = json.loads(text)
                step = line[step_key]
                values = []
                for key, value in line.items():
                    if key != step_key:
                        flatten(f"{name}/{key}", value, values)
                for tag, value in values:
                    with np.errstate(over="ignore"):
                        as_f32 = np.float32(value)
                    expected.setdefault(tag, []).append((step, as_f32, f"{path}:{number}"))
                lines_read += 1
    return expected, lines_read


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def main():
    out_dir = sys.argv[1]
    tb = os.path.join(out_dir, "tb")
    files = sorted(f for f in os.listdir(tb) if "tfevents" in f)
    assert files, f"no event files in {tb}"
    for name in files:
        first = next(iter(event_file_loader.EventFileLoader(os.path.join(tb, name)).Load()))
        assert first.file_version == "brain.Event:2", f"{name}: first event {first}"

    accumulator = event_accumulator.EventAccumulator(
        tb, size_guidance={event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    found_tags = set(accumulator.Tags()["scalars"])
    expected, lines_read = expected_scalars(out_dir)
    assert lines_read > 0, f"no JSON lines in {out_dir}"
    missing = sorted(set(expected) - found_tags)
    extra = sorted(found_tags - set(expected))
    assert not missing, f"tags in the JSON lines but not in TensorBoard: {missing}"
    assert not extra, f"tags in TensorBoard but not in the JSON lines: {extra}"
    checked = 0
    for tag, wanted in sorted(expected.items()):
        got = [(e.step, e.value) for e in accumulator.Scalars(tag)]
        assert len(got) == len(wanted), (
            f"{tag}: {len(got)} points in TensorBoard (steps {[s for s, _ in got]}), "
            f"{len(wanted)} in the JSON lines (steps {[s for s, _, _ in wanted]})"
        )
        for (step, value), (want_step, want, where) in zip(got, wanted):
            assert step == want_step, f"{tag}: step {step} in TensorBoard, {want_step} at {where}"
            assert same(float(np.float32(value)), float(want)), (
                f"{tag} at step {step}: {value} in TensorBoard, {want} at {where}"
            )
            checked += 1
    print(f"{checked} scalars of {lines_read} lines under {len(expected)} tags in {len(files)} "
          f"event file(s): checks passed")


if __name__ == "__main__":
    main()
