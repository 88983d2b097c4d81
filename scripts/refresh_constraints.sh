#!/usr/bin/env bash
# Refresh tests/constraints.txt: the exact versions of every package the tests run with (torch excluded:
# it is installed first, as README.md "Install" says, CPU or CUDA build). CI (.ci/run) and README.md install
# with `-c tests/constraints.txt`, so a new release of pytest, transformers, ... reaches the tests only
# through this script and a green CI run.
#
#   bash scripts/refresh_constraints.sh      # newest releases allowed by pyproject.toml
#   bash .ci/run                             # then check them before committing the file
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q torch==2.13.0
"$tmp/venv/bin/pip" install -q -e ".[dev,ct2,serve,hf,onnx]"
{
    echo "# Versions the test suite was last run with (bash scripts/refresh_constraints.sh; see README.md \"Install\")."
    "$tmp/venv/bin/pip" freeze --exclude-editable | grep -v -i -E '^(torch|triton|nvidia-)' | grep -v '^-e '
} > tests/constraints.txt
echo "wrote tests/constraints.txt ($(grep -c '==' tests/constraints.txt) packages)"
