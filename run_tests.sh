#!/usr/bin/env bash
# Run the test suite:  ./run_tests.sh [pytest args ...]
# First use creates .venv with the dev extras (see scripts/bootstrap.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXTRAS=dev source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# Caches and temporary files of the run stay in one folder we remove afterwards.
SCRATCH="$(mktemp -d "$ROOT/.test-scratch.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
export TMPDIR="$SCRATCH" TORCHINDUCTOR_CACHE_DIR="$SCRATCH/inductor" TIKTOKEN_CACHE_DIR="$SCRATCH/tiktoken" HF_HOME="$SCRATCH/hf"
export HYPOTHESIS_STORAGE_DIRECTORY="$SCRATCH/hypothesis"
set +e
"$PYTHON" -m pytest "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests: report it rather than pretend success.
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi
exit $rc
