#!/usr/bin/env bash
# Packs everything a GPU host needs to check this tree into .gpu/ (git-ignored): the release
# binaries, every test executable (kernels embedded), the test fixtures, the PyTorch peer
# benchmarks (bench/peers/*.py) and a runner.
#
#   scripts/gpu-pack.sh                  # build with the pinned nvcc, pack into .gpu/
#   bash .gpu/run.sh OUT_DIR             # on the GPU host, from the repository root or anywhere
#
# The GPU hosts have a driver, CUDA 13.0 and PyTorch but no Rust and no network, so kernels are
# compiled here and the executables travel (see shared/GPU.md). Debug info is stripped to keep
# the pack small (well under 64 MiB).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ -z "${NVCC:-}" ]; then
  NVCC=$(scripts/install-cuda-toolchain.sh | tail -n 1)
fi
export NVCC SWERVE_REQUIRE_CUDA=1

cargo build --release --bins
# Test executables: cargo prints one JSON record per artifact; keep those that are test harnesses.
cargo test --release --no-run --message-format=json >/tmp/swerve-gpu-pack.json
mapfile -t tests < <(python3 - /tmp/swerve-gpu-pack.json <<'PY'
import json, sys
seen = set()
for line in open(sys.argv[1]):
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    if rec.get("reason") == "compiler-artifact" and rec.get("profile", {}).get("test") and rec.get("executable"):
        if rec["executable"] not in seen:
            seen.add(rec["executable"])
            print(rec["executable"])
PY
)

rm -rf .gpu
mkdir -p .gpu/bin .gpu/tests .gpu/peers
for bin in swerve-serve swerve-train swerve-bench; do
  cp "target/release/$bin" .gpu/bin/
done
for exe in "${tests[@]}"; do
  # target/release/deps/parity-0123abcd -> parity
  name=$(basename "$exe" | sed -E 's/-[0-9a-f]{16}$//')
  cp "$exe" ".gpu/tests/$name"
done
strip --strip-debug .gpu/bin/* .gpu/tests/*
mkdir -p .gpu/tests/fixtures
cp -r tests/fixtures/*/ .gpu/tests/fixtures/
mkdir -p .gpu/assets && cp -r assets/qwen2.5 .gpu/assets/
cp bench/peers/*.py .gpu/peers/
cp scripts/gpu-run.sh .gpu/run.sh
git rev-parse HEAD >.gpu/COMMIT 2>/dev/null || echo unknown >.gpu/COMMIT
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then echo "(with uncommitted changes)" >>.gpu/COMMIT; fi

size=$(du -sm .gpu | cut -f1)
echo "packed .gpu/: ${#tests[@]} test executables, ${size} MiB, commit $(head -n 1 .gpu/COMMIT)" >&2
if [ "$size" -ge 64 ]; then
  echo "error: .gpu/ is ${size} MiB; it must stay under 64 MiB to travel" >&2
  exit 1
fi
