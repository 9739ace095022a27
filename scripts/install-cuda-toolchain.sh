#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler (nvcc, ptxas, crt headers, NVVM, runtime headers, CCCL)
# from NVIDIA's PyPI wheels into a cache folder, without a system CUDA toolkit. Idempotent: a
# second run with the same pins does nothing. Prints the nvcc path on its last line of stdout.
#
#   scripts/install-cuda-toolchain.sh            # cache in ${SWERVE_CUDA_CACHE:-$HOME/.cache/swerve/cuda-13.0}
#   NVCC=$(scripts/install-cuda-toolchain.sh | tail -n 1)
#
# Pinned to 13.0 so the PTX matches the GPU hosts' driver (580, CUDA 13.0): see shared/GPU.md.
set -euo pipefail

PINS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)
cache="${SWERVE_CUDA_CACHE:-$HOME/.cache/swerve/cuda-13.0}"
python="${PYTHON:-python3}"
stamp="$cache/.installed"
want="$(printf '%s\n' "${PINS[@]}")"

find_nvcc() {
  local found
  found=$(find "$cache/venv" -path '*/nvidia/cu13/bin/nvcc' -type f 2>/dev/null | head -n 1)
  [ -n "$found" ] && [ -x "$found" ] && echo "$found"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && nvcc=$(find_nvcc); then
  echo "cuda toolchain: already installed in $cache" >&2
  echo "$nvcc"
  exit 0
fi

echo "cuda toolchain: installing ${PINS[*]} into $cache" >&2
mkdir -p "$cache"
if [ ! -x "$cache/venv/bin/python" ]; then
  "$python" -m venv "$cache/venv" >&2
fi
"$cache/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${PINS[@]}" >&2

if ! nvcc=$(find_nvcc); then
  echo "cuda toolchain: the wheels installed but no nvidia/cu13/bin/nvcc was found under $cache/venv" >&2
  exit 1
fi
"$nvcc" --version >&2
echo "$want" >"$stamp"
echo "$nvcc"
