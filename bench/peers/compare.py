#!/usr/bin/env python3
"""Side by side: swerve's rows and the peers' from the JSONL records that swerve-bench and the
peer scripts write (--jsonl). For each table, one line per key: swerve's median and TFLOP/s, each
peer's, and the ratio peer_median / swerve_median (> 1: swerve is faster); where a table has more
than one peer (attention, attention_bwd: sdpa-flash, sdpa-cudnn), also the ratio to the fastest.

    python3 compare.py OUT/swerve.jsonl OUT/peers.jsonl
"""

import json
import sys

SWERVE = "swerve"
TABLE_ORDER = ["attention", "attention_bwd", "prefill"]


def load(paths):
    records = []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError as err:
            print(f"warning: {path}: {err.strerror}", file=sys.stderr)
            continue
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                print(f"warning: {path}:{n}: not JSON, ignored", file=sys.stderr)
                continue
            if isinstance(rec, dict) and "table" in rec and "impl" in rec:
                records.append(rec)
            else:
                print(f"warning: {path}:{n}: no table/impl, ignored", file=sys.stderr)
    return records


def number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fmt(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(peer, swerve):
    return None if peer is None or swerve is None or swerve <= 0 else peer / swerve


def table_lines(table, rows):
    """rows: {(impl, key): record}, in first-seen order."""
    keys = list(dict.fromkeys(key for _, key in rows))
    impls = list(dict.fromkeys(impl for impl, _ in rows))
    peers = [impl for impl in impls if impl != SWERVE]
    header = ["key", "swerve ms", "TF/s"]
    for peer in peers:
        header += [f"{peer} ms", "TF/s", "ratio"]
    if len(peers) > 1:
        header.append("fastest peer ratio")
    body, notes = [], {}
    for key in keys:
        def get(impl):
            rec = rows.get((impl, key))
            if rec is None:
                return None, None
            if rec.get("note"):
                notes.setdefault((impl, rec["note"]), []).append(key)
            return number(rec.get("median_ms")), number(rec.get("tflops"))

        swerve_ms, swerve_tf = get(SWERVE)
        line = [key, fmt(swerve_ms, 3), fmt(swerve_tf, 1)]
        peer_ms = []
        for peer in peers:
            ms, tf = get(peer)
            line += [fmt(ms, 3), fmt(tf, 1), fmt(ratio(ms, swerve_ms), 2)]
            if ms is not None:
                peer_ms.append(ms)
        if len(peers) > 1:
            line.append(fmt(ratio(min(peer_ms) if peer_ms else None, swerve_ms), 2))
        body.append(line)
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    out = [f"== {table}" + (" (ratio = peer median / swerve median; > 1: swerve is faster)" if peers else "")]
    for row in [header] + body:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
    if notes:
        out.append("notes:")
        for (impl, note), note_keys in notes.items():
            impl_keys = [key for i, key in rows if i == impl]
            where = "every row" if len(note_keys) == len(impl_keys) > 1 else ", ".join(note_keys)
            out.append(f"  {impl} [{where}]: {note}")
    return out


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    records = load(argv)
    devices = list(dict.fromkeys(
        f"device: {r.get('impl')}: {r.get('name', '?')}"
        + (f", torch {r['torch']}" if r.get("torch") else "")
        + (f" ({r['note']})" if r.get("note") else "")
        for r in records if r["table"] == "device"))
    tables = {}
    for r in records:
        if r["table"] == "device" or "key" not in r:
            continue
        tables.setdefault(r["table"], {})[(r["impl"], r["key"])] = r  # the last record of a row wins
    if not tables:
        print("compare: no benchmark records in " + " ".join(argv))
        return 0
    lines = devices[:]
    order = [t for t in TABLE_ORDER if t in tables] + [t for t in tables if t not in TABLE_ORDER]
    for table in order:
        lines.append("")
        lines += table_lines(table, tables[table])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
