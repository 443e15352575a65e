#!/usr/bin/env bash
# Checks that the tracked C/C++/CUDA sources of cpp/, cuda/, python/bindings/ and tests/
# follow .clang-format: clang-format --dry-run --Werror, which changes nothing and fails
# listing every difference. Use the clang-format pinned in tests/requirements.txt (the
# version decides the layout). To fix: the same files through `clang-format -i`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mapfile -t files < <(git ls-files -- \
  'cpp/*.hpp' 'cpp/*.h' 'cpp/*.cpp' 'cpp/*.cu' 'cpp/*.cuh' \
  'cuda/*.hpp' 'cuda/*.h' 'cuda/*.cpp' 'cuda/*.cu' 'cuda/*.cuh' \
  'python/bindings/*.hpp' 'python/bindings/*.h' 'python/bindings/*.cpp' \
  'tests/*.hpp' 'tests/*.h' 'tests/*.cpp' 'tests/*.cu' 'tests/*.cuh')
if [ "${#files[@]}" -eq 0 ]; then
  echo "check_format: no C/C++/CUDA files found (not a git checkout?)" >&2
  exit 1
fi
clang-format --dry-run --Werror "${files[@]}"
echo "check_format: ${#files[@]} files follow .clang-format ($(clang-format --version))"
