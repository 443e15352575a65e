#!/usr/bin/env bash
# One leg of the CI support matrix: a fresh virtual environment for one Python version and
# one torch, a regular (non-editable) install of this package, then the whole test suite.
#
#   tools/ci_matrix.sh PYTHON TORCH_SPEC
#
# PYTHON      a version such as 3.9 (found with `pyenv prefix`, else as python3.9 on PATH)
#             or the path of an interpreter.
# TORCH_SPEC  a pip requirement such as "torch==2.4.1", or "newest": the newest torch the
#             package index resolves for that Python, with any pip constraint file lifted.
#
# The CUDA kernels are not compiled here (QRNN_CUDA=OFF): the main CI leg compiles them.
# Exit status: non-zero when anything fails, the tests included.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 2 ]; then
  echo "usage: $0 PYTHON TORCH_SPEC   (e.g. $0 3.9 torch==2.4.1, or $0 3.13 newest)" >&2
  exit 2
fi
want_python=$1
torch_spec=$2
start=$SECONDS

find_python() {
  local version=$1 prefix
  if [ -x "$version" ]; then echo "$version"; return 0; fi
  if command -v pyenv >/dev/null 2>&1 && prefix=$(pyenv prefix "$version" 2>/dev/null); then
    # pyenv prefix may list several folders (one per line); take the first with the binary.
    while IFS= read -r dir; do
      if [ -x "$dir/bin/python$version" ]; then echo "$dir/bin/python$version"; return 0; fi
    done <<<"$prefix"
  fi
  if command -v "python$version" >/dev/null 2>&1; then command -v "python$version"; return 0; fi
  return 1
}

if ! python=$(find_python "$want_python"); then
  echo "ci_matrix: no Python $want_python found: install it with pyenv (pyenv install $want_python)" \
       "or put python$want_python on PATH" >&2
  exit 1
fi

if [ "$torch_spec" = newest ]; then
  requirement=torch
  # Lift a site-wide constraint file (pip config `constraint`) that may cap torch: the
  # environment variable replaces the configured file (an empty value would not).
  export PIP_CONSTRAINT=/dev/null
  label=newest
else
  requirement=$torch_spec
  label=$(echo "$torch_spec" | tr -c 'A-Za-z0-9.\n' '_')
fi
py_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=".venv-matrix/py${py_version}-${label}"
echo "== matrix leg: Python $py_version ($python), $requirement -> $venv =="

rm -rf "$venv"
"$python" -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "$requirement"
# The package itself: a regular install (build isolation fetches scikit-build-core, pybind11).
QRNN_CUDA=OFF python -m pip install --quiet ".[train]" -r tests/requirements.txt

python - <<'EOF'
import platform, sys
import numpy, torch
import qrnn
print(f"versions: Python {platform.python_version()}, torch {torch.__version__}, "
      f"numpy {numpy.__version__}, qrnn {qrnn.__version__}")
EOF

# Tests run from the repository root against the installed package. No cache folder: the
# legs share the checkout.
python -m pytest -p no:cacheprovider -q
echo "== matrix leg Python $py_version, $requirement: passed in $((SECONDS - start)) s =="
