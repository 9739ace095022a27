#!/usr/bin/env bash
# The runner scripts/gpu-pack.sh copies to .gpu/run.sh. On a GPU host:
#
#   bash .gpu/run.sh OUT_DIR                 # every step
#   bash .gpu/run.sh OUT_DIR 'test-*'        # only the steps whose names match one of the globs
#                                            # (a device call is capped at 10 minutes: split there)
#
# 1. finds the CUDA libraries cudarc loads (libcuda from the driver; cuBLAS, cuBLASLt and NCCL
#    from the system or from PyTorch's nvidia/*/lib folders) and sets LD_LIBRARY_PATH;
# 2. runs every packed test executable (tests/gpu_*.rs) with --include-ignored, then the benchmarks:
#    swerve-bench's, then the PyTorch peers (peers/*.py) on the same card;
# 3. writes one log per step and summary.txt (a table of steps and outcomes, the benchmark tables,
#    and swerve against the peers side by side) into OUT_DIR, plus the benchmark rows as JSON lines
#    (swerve.jsonl, peers.jsonl; schema in bench/peers/README.md).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUT_DIR [STEP_GLOB...]}
shift
patterns=("$@")
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
rm -f "$out/swerve.jsonl" "$out/peers.jsonl"
log() { echo "$*" | tee -a "$summary"; }

log "swerve GPU run: commit $(tr '\n' ' ' <"$here/COMMIT"), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1

libdirs=()
# NCCL: the file swerve opens (src/dist/nccl/library.rs) is libnccl.so.2, the only name the wheels ship.
for lib in libcublas.so libcublasLt.so libnccl.so.2; do
  if ldconfig -p 2>/dev/null | grep -q "$lib"; then continue; fi
  found=$(python3 - "$lib" <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for path in sorted(glob.glob(os.path.join(root, "nvidia", "**", sys.argv[1] + "*"), recursive=True)):
        print(os.path.dirname(path)); raise SystemExit
PY
)
  if [ -n "$found" ]; then libdirs+=("$found"); else log "warning: $lib not found (system or PyTorch's nvidia packages)"; fi
done
if [ ${#libdirs[@]} -gt 0 ]; then
  LD_LIBRARY_PATH=$(printf '%s:' $(printf '%s\n' "${libdirs[@]}" | sort -u))${LD_LIBRARY_PATH:-}
  export LD_LIBRARY_PATH
fi
log "libcuda: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so' | awk '{print $NF}')"
log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

export SWERVE_ROOT="$here" SWERVE_BIN_DIR="$here/bin" RUST_BACKTRACE=1
# The packed bubblewrap, for agent rollouts, when the host has none.
if ! command -v bwrap >/dev/null 2>&1 && [ -x "$here/sandbox/bwrap" ]; then
  chmod 755 "$here" "$here/sandbox" "$here/sandbox/lib" 2>/dev/null
  export PATH="$here/sandbox:$PATH"
fi
failed=0
wanted() {
  [ ${#patterns[@]} -eq 0 ] && return 0
  local p
  for p in "${patterns[@]}"; do
    # shellcheck disable=SC2053
    [[ $1 == $p ]] && return 0
  done
  return 1
}
step() {
  local name=$1; shift
  wanted "$name" || return 0
  local start=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then status=ok; else status="FAILED ($?)"; failed=1; fi
  local result
  result=$(grep -E '^test result:' "$out/$name.log" | tail -n 1)
  printf '%-28s %-12s %5ss  %s\n' "$name" "$status" $((SECONDS - start)) "$result" | tee -a "$summary"
}

for exe in "$here"/tests/*; do
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  # The official openai client is installed from PyPI by .ci/run; GPU hosts have no network.
  wanted "test-$(basename "$exe")" || continue
  if [ "$(basename "$exe")" = serve_openai ] && ! python3 -c 'import openai' 2>/dev/null; then
    printf '%-28s %-12s  %s\n' "test-serve_openai" skipped "no openai Python package on this host (CI runs it)" | tee -a "$summary"
    continue
  fi
  # A hung test (a kernel that never returns) must not eat the device call: 5 minutes each
  # (SWERVE_GPU_TEST_TIMEOUT seconds when set: a first run of a new kernel).
  step "test-$(basename "$exe")" timeout "${SWERVE_GPU_TEST_TIMEOUT:-300}" "$exe" --include-ignored --test-threads=1
done
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over the small attention cases: the
# kernels with shared memory, cp.async, ldmatrix/mma and warp shuffles. A report is a failure.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)
for tool in memcheck racecheck synccheck initcheck; do
  wanted "sanitize-$tool" || continue
  if [ -z "$sanitizer" ]; then
    printf '%-28s %-12s  %s\n' "sanitize-$tool" skipped "no compute-sanitizer on this host" | tee -a "$summary"
    continue
  fi
  step "sanitize-$tool" timeout 900 bash -c "
    '$sanitizer' --tool $tool --error-exitcode 9 '$here/tests/gpu_kernels' --include-ignored --test-threads=1 flash_attention &&
    '$sanitizer' --tool $tool --error-exitcode 9 '$here/tests/gpu_attention_grad' --include-ignored --test-threads=1 attention_backward_matches &&
    '$sanitizer' --tool $tool --error-exitcode 9 '$here/tests/gpu_paged' --include-ignored --test-threads=1 decode_rows_of_very_different_contexts"
done
step rl-toy timeout 300 "$here/bin/swerve-train" rl --model preset:toy --tasks builtin:toy --out "$out/rl-toy" --device cuda
step rollout-oracle timeout 120 "$here/bin/swerve-train" rollout --tasks builtin:python-bugs --policy oracle --group 1 --out "$out/rollout-oracle"
step bench-rl timeout 300 "$here/bin/swerve-bench" rl --device cuda --jsonl "$out/swerve.jsonl"
step bench-kernels "$here/bin/swerve-bench" kernels --jsonl "$out/swerve.jsonl"
# Which per-M cuBLASLt choices keep a forward GEMM row's bits (issue 36): every Qwen2.5 shape.
step bench-gemm timeout 360 "$here/bin/swerve-bench" gemm --rows 1,2,4,8,16,17,32,64,128,256,1024,4096 --candidates 6 --reps 10 --jsonl "$out/gemm.jsonl"
step bench-prefill "$here/bin/swerve-bench" prefill --jsonl "$out/swerve.jsonl"
step bench-agent timeout 400 "$here/bin/swerve-bench" agent --preset qwen2.5-0.5b --tasks 4 --group 10 --max-context 16384 --http --jsonl "$out/swerve.jsonl"
step bench-prefill-7b timeout 240 "$here/bin/swerve-bench" prefill --preset qwen2.5-7b --seq-lens 4096,16384,32768 --jsonl "$out/swerve.jsonl"
step bench-prefill-7b-per-shape timeout 240 "$here/bin/swerve-bench" prefill --preset qwen2.5-7b --seq-lens 4096,16384,32768 --exact-logprobs false
step bench-decode-7b timeout 300 "$here/bin/swerve-bench" decode --preset qwen2.5-7b --jsonl "$out/swerve.jsonl"
step bench-decode-7b-per-shape timeout 300 "$here/bin/swerve-bench" decode --preset qwen2.5-7b --exact-logprobs false --attention-contexts 0
step bench-decode-7b-class-tiles timeout 300 "$here/bin/swerve-bench" decode --preset qwen2.5-7b --exact-gemm-tiles class --attention-contexts 0
step bench-decode-7b-eager timeout 200 "$here/bin/swerve-bench" decode --preset qwen2.5-7b --batch-sizes 1,8 --attention-contexts 0 --no-cuda-graphs
step bench-train-1.5b timeout 400 "$here/bin/swerve-bench" train --preset qwen2.5-1.5b --jsonl "$out/swerve.jsonl"
step bench-train-1.5b-per-shape timeout 400 "$here/bin/swerve-bench" train --preset qwen2.5-1.5b --exact-logprobs false
step bench-train-1.5b-131k timeout 500 "$here/bin/swerve-bench" train --preset qwen2.5-1.5b-yarn4 --tokens 131072 --reps 1 --jsonl "$out/swerve.jsonl"
# The previous kernels on the same card, when the pack carries a baseline swerve-bench
# (BASELINE_BENCH=path scripts/gpu-pack.sh): the same decode, prefill and training rows, to
# state what a change costs (its rows go to baseline.jsonl).
if [ -x "$here/baseline/swerve-bench" ]; then
  base="$here/baseline/swerve-bench"
  step baseline-prefill-7b timeout 240 "$base" prefill --preset qwen2.5-7b --seq-lens 4096,16384,32768 --jsonl "$out/baseline.jsonl"
  step baseline-decode-7b timeout 300 "$base" decode --preset qwen2.5-7b --jsonl "$out/baseline.jsonl"
  step baseline-train-1.5b timeout 400 "$base" train --preset qwen2.5-1.5b --jsonl "$out/baseline.jsonl"
fi
# The peers on the same card (PyTorch SDPA flash/cuDNN, transformers' Qwen2): same shapes and keys.
# The time limits only cap a run gone wrong; rows already measured stay in peers.jsonl.
step bench-peers-attention timeout 300 python3 "$here/peers/attention.py" --jsonl "$out/peers.jsonl"
step bench-peers-prefill timeout 180 python3 "$here/peers/prefill.py" --jsonl "$out/peers.jsonl"

for f in "$out"/bench-*.log "$out"/baseline-*.log; do
  [ -f "$f" ] && { echo; echo "== $(basename "$f")"; cat "$f"; } >>"$summary"
done
grep -h -E '^(rmsnorm|add_rmsnorm).*error' "$out"/test-*.log >>"$summary" 2>/dev/null
{ echo; echo "== swerve against the peers"; python3 "$here/peers/compare.py" "$out"/*.jsonl 2>&1; } >>"$summary"
exit $failed
