#!/usr/bin/env bash
# Run the test suite:  ./run_tests.sh [pytest args ...]   (on every core; -n 0: in one process)
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
# On every core (pytest-xdist, one worker per core; TORCHNLQ_TEST_WORKERS=N for N): a test file's tests share a
# worker, so its module fixtures are built once (tests/conftest.py). -n 0 (or --pdb work) runs in this process.
"$PYTHON" -m pytest -n "${TORCHNLQ_TEST_WORKERS:-auto}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests: report it rather than pretend success.
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi
exit $rc
