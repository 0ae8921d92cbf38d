#!/usr/bin/env bash
# Train a model:  ./run_train.sh [CONFIG.toml] [--section.key value ...]
# No CONFIG: train_configs/debug_model.toml, the offline CPU debug run.
# Environment:
#   NGPU=N      processes on this node (default 1); N > 1 launches torchrun
#   LOG_RANK=r  which ranks' output torchrun shows (default 0)
#   NNODES, NODE_RANK, RDZV_ENDPOINT  multi-node rendezvous (see docs/parallelism.md)
#   STOP_TIMEOUT=s  after SIGTERM/SIGINT, how long workers may take to finish the step and save (default 300)
# First use creates .venv and installs torchnlq into it (see scripts/bootstrap.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"

CONFIG_FILE="${CONFIG_FILE:-$ROOT/train_configs/debug_model.toml}"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  CONFIG_FILE="$1"; shift
fi
case " $* " in *" --help "*|*" -h "*) exec "$PYTHON" -m torchnlq.train --help ;; esac

# Keep caches inside the outputs folder rather than scattered over $HOME and /tmp.
CACHE="${TORCHNLQ_CACHE:-$PWD/outputs/.cache}"
mkdir -p "$CACHE/tmp"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$CACHE/inductor}"
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$CACHE/tiktoken}"
export HF_HOME="${HF_HOME:-$CACHE/hf}"
export TMPDIR="${TMPDIR_OVERRIDE:-$CACHE/tmp}"

NGPU="${NGPU:-1}"
LOG_RANK="${LOG_RANK:-0}"
if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NGPU='$NGPU' must be a positive integer" >&2; exit 2
fi
if [ "$NGPU" = 1 ] && [ -z "${NNODES:-}" ]; then
  exec "$PYTHON" -m torchnlq.train "$CONFIG_FILE" "$@"
fi
# Config and data mistakes as one line here, rather than inside torchrun's multi-rank report.
"$PYTHON" -m torchnlq.train --preflight "$CONFIG_FILE" "$@" || exit $?
rdzv=(--standalone)
if [ -n "${NNODES:-}" ] && [ "${NNODES}" != 1 ]; then
  rdzv=(--nnodes "$NNODES" --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port for multi-node}")
fi
stop=()
if [ -n "${STOP_TIMEOUT:-}" ]; then
  if ! [[ "$STOP_TIMEOUT" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: STOP_TIMEOUT='$STOP_TIMEOUT' must be a positive number of seconds" >&2; exit 2
  fi
  stop=(--shutdown-timeout "$STOP_TIMEOUT")
fi
# torchrun's launcher, ending in one error: line (or the resume hint after a signal): torchnlq/train/launch.py
exec "$PYTHON" -m torchnlq.train.launch "${rdzv[@]}" --nproc_per_node "$NGPU" \
  "${stop[@]}" --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m torchnlq.train "$CONFIG_FILE" "$@"
