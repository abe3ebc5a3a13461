#!/usr/bin/env bash
# Compile every CUDA source of the probe with nvcc for sm_80 and sm_90, to PTX and to cubin.
# The files are compiled as they are on disk (with -I probe/cuda); the unit tests compile the
# include-expanded text that CuPy's RawModule builds. Exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda_dir="$root/probe/cuda"
nvcc="${NVCC:-nvcc}"

if ! command -v "$nvcc" >/dev/null 2>&1; then
  echo "compile_cuda: nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
  exit 1
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ccld-cuda.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

shopt -s nullglob
sources=("$cuda_dir"/*.cu)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "compile_cuda: no .cu files in $cuda_dir" >&2
  exit 1
fi

"$nvcc" --version | tail -n 1
failed=0
total=0
for src in "${sources[@]}"; do
  name="$(basename "$src" .cu)"
  for arch in sm_80 sm_90; do
    for fmt in ptx cubin; do
      total=$((total + 1))
      out="$tmp/$name.$arch.$fmt"
      if "$nvcc" -arch="$arch" "-$fmt" -std=c++17 -Werror all-warnings -I "$cuda_dir" -o "$out" "$src" \
        >"$out.log" 2>&1 && [ -s "$out" ]; then
        echo "ok   $name.cu $arch $fmt"
      else
        failed=$((failed + 1))
        echo "FAIL $name.cu $arch $fmt"
        sed 's/^/     /' "$out.log"
      fi
    done
  done
done

echo "compile_cuda: $((total - failed))/$total compiled"
[ "$failed" -eq 0 ]
