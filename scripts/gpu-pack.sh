#!/usr/bin/env bash
# Packs everything a GPU host needs to check this tree into .gpu/ (git-ignored): the release
# binaries, the GPU test executables (`tests/gpu_*.rs`, kernels embedded), the
# PyTorch peer benchmarks (bench/peers/*.py) and the runner (scripts/gpu-run.sh), compressed into
# .gpu/payload.tar.xz beside a small .gpu/run.sh that unpacks and runs it.
#
#   scripts/gpu-pack.sh                  # build with the pinned nvcc, pack into .gpu/
#   bash .gpu/run.sh OUT_DIR             # on the GPU host, from the repository root or anywhere
#
# The GPU hosts have a driver, CUDA 13.0 and PyTorch but no Rust and no network, so kernels are
# compiled here and the executables travel (see shared/GPU.md); the carry and the tracked tree
# together must stay under 64 MiB, so the tracked fixtures are not packed twice.
# The other test executables pin the CPU backend (CI runs them), so they stay home; symbols are
# stripped and everything is xz-compressed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ -z "${NVCC:-}" ]; then
  NVCC=$(scripts/install-cuda-toolchain.sh | tail -n 1)
fi
export NVCC SWERVE_REQUIRE_CUDA=1
# Real fatbins for a real GPU: an emulated build (SWERVE_EMU=1) would pack CPU kernels.
unset SWERVE_EMU

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
stage=.gpu/payload
mkdir -p "$stage/bin" "$stage/tests" "$stage/peers"
for bin in swerve-serve swerve-train swerve-bench; do
  cp "${CARGO_TARGET_DIR:-target}/release/$bin" "$stage/bin/"
done
packed=0
for exe in "${tests[@]}"; do
  # target/release/deps/gpu_kernels-0123abcd -> gpu_kernels
  name=$(basename "$exe" | sed -E 's/-[0-9a-f]{16}$//')
  case "$name" in gpu_*) cp "$exe" "$stage/tests/$name"; packed=$((packed + 1)) ;; esac
done
strip --strip-all "$stage"/bin/* "$stage"/tests/*
# The test fixtures and assets are tracked files, so they travel with the working tree already:
# the runner links them from the repository root instead of packing a second copy.
cp bench/peers/*.py "$stage/peers/"
cp scripts/gpu-run.sh "$stage/run.sh"
# A baseline swerve-bench (an earlier commit's release binary) for cost comparisons on the same card.
if [ -n "${BASELINE_BENCH:-}" ]; then
  mkdir -p "$stage/baseline" && cp "$BASELINE_BENCH" "$stage/baseline/swerve-bench"
fi
# bubblewrap for the agent sandbox (the GPU hosts have none and no network): the binary, the
# shared libraries it needs beyond glibc, and a wrapper that finds them.
if command -v bwrap >/dev/null 2>&1; then
  mkdir -p "$stage/sandbox/lib"
  cp "$(command -v bwrap)" "$stage/sandbox/bwrap.bin"
  for lib in $(ldd "$(command -v bwrap)" | awk '/=>/ {print $3}' | grep -v -E 'libc\.so|ld-linux'); do
    cp -L "$lib" "$stage/sandbox/lib/"
  done
  cat >"$stage/sandbox/bwrap" <<'WRAP'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib" exec "$here/bwrap.bin" "$@"
WRAP
  chmod 755 "$stage/sandbox/bwrap"
fi
git rev-parse HEAD >"$stage/COMMIT" 2>/dev/null || echo unknown >"$stage/COMMIT"
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then echo "(with uncommitted changes)" >>"$stage/COMMIT"; fi
cp "$stage/COMMIT" .gpu/COMMIT
# -9: a 64 MiB dictionary, so the kernels every executable embeds are stored once (44 -> 9 MiB).
XZ_OPT=-9 tar -cJf .gpu/payload.tar.xz -C .gpu payload
rm -rf "$stage"
cat >.gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Unpacks payload.tar.xz (made by scripts/gpu-pack.sh) next to this script and runs its runner.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$here/payload"
tar -xJf "$here/payload.tar.xz" -C "$here"
# Fixtures and assets come from the repository this folder sits in (tracked files travel).
repo=$(cd "$here/.." && pwd)
mkdir -p "$here/payload/tests"
for path in tests/fixtures assets; do
  if [ -e "$repo/$path" ]; then ln -sfn "$repo/$path" "$here/payload/$path"; else echo "warning: $repo/$path missing" >&2; fi
done
exec bash "$here/payload/run.sh" "$@"
RUN

size=$(du -sm .gpu | cut -f1)
tracked=$(( $(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c) >> 20 ))
echo "packed .gpu/: $packed GPU test executables, ${size} MiB compressed, commit $(head -n 1 .gpu/COMMIT)" >&2
if [ $((size + tracked)) -ge 64 ]; then
  echo "error: .gpu/ is ${size} MiB and the tracked tree ${tracked} MiB; together they must stay under 64 MiB to travel" >&2
  exit 1
fi
