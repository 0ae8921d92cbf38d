#!/usr/bin/env bash
# Train a model:  ./run_train.sh [CONFIG.toml | --job.config_file CONFIG.toml] [--section.key value ...] [--print-config | --help]
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

if [ -n "${CONFIG_FILE:-}" ] && { [ $# -eq 0 ] || [[ "$1" == -* ]]; }; then
  # torchtitan's spelling; said out loud, so that a variable left in the environment never swaps the config silently
  echo "[torchnlq] config from the CONFIG_FILE environment variable: $CONFIG_FILE" >&2
fi
from_env="${CONFIG_FILE:-}"
CONFIG_FILE="${CONFIG_FILE:-$ROOT/train_configs/debug_model.toml}"
given=""
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  if [ -n "$from_env" ] && [ "$from_env" != "$1" ]; then
    echo "[torchnlq] the CONFIG_FILE environment variable ($from_env) is not used: the command names $1" >&2
  fi
  CONFIG_FILE="$1"; given=1; shift
fi
config=("$CONFIG_FILE")
for arg in "$@"; do  # --job.config_file PATH (torchtitan's spelling) names the config instead
  case "$arg" in --job.config_file|--job.config_file=*) [ -n "$given" ] || config=() ;; esac  # both: Python says so
done
# Help and the resolved config are printed by one process, whatever NGPU says.
for arg in "$@"; do
  case "$arg" in --help|-h|--print-config) exec "$PYTHON" -m torchnlq.train "${config[@]}" "$@" ;; esac
done

fail() { echo "error: $*" >&2; exit 2; }
NGPU="${NGPU:-1}"
LOG_RANK="${LOG_RANK:-0}"
[[ "$NGPU" =~ ^[1-9][0-9]*$ ]] || fail "NGPU='$NGPU' must be a positive integer"
[[ "$LOG_RANK" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "LOG_RANK='$LOG_RANK' must be a rank or a comma-separated list of ranks, e.g. 0 or 0,1"
if [ -n "${STOP_TIMEOUT:-}" ] && ! [[ "$STOP_TIMEOUT" =~ ^[1-9][0-9]*$ ]]; then
  fail "STOP_TIMEOUT='$STOP_TIMEOUT' must be a positive number of seconds"
fi
multinode=""
if [ -n "${NNODES:-}" ] && [ "${NNODES}" != 1 ]; then
  [[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || fail "NNODES='$NNODES' must be a positive integer"
  [ -n "${RDZV_ENDPOINT:-}" ] || fail "NNODES=$NNODES needs RDZV_ENDPOINT=host:port (the first node's address) on every node"
  if ! [[ "${NODE_RANK:-0}" =~ ^[0-9]+$ ]] || [ "${NODE_RANK:-0}" -ge "$NNODES" ]; then
    fail "NODE_RANK='${NODE_RANK:-}' must be this node's index, 0..$((NNODES - 1)) (NNODES=$NNODES)"
  fi
  multinode=1
elif [ -n "${NODE_RANK:-}" ] && [ "$NODE_RANK" != 0 ]; then
  fail "NODE_RANK=$NODE_RANK is set but NNODES is not (one node): set NNODES on every node, or unset NODE_RANK"
fi
for rank in ${LOG_RANK//,/ }; do  # torchrun filters local ranks: one beyond NGPU would show nothing at all
  [ "$rank" -lt "$NGPU" ] || fail "LOG_RANK=$rank is not a local rank of this node (NGPU=$NGPU: 0..$((NGPU - 1)))"
done

# Keep caches inside the outputs folder rather than scattered over $HOME and /tmp. The folder is
# made by the trainer once the config is checked (a mistake leaves nothing behind), or below.
CACHE="${TORCHNLQ_CACHE:-$PWD/outputs/.cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$CACHE/inductor}"
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$CACHE/tiktoken}"
export HF_HOME="${HF_HOME:-$CACHE/hf}"
export TMPDIR="${TMPDIR_OVERRIDE:-$CACHE/tmp}"
# Each folder the run writes into (made later where missing): a file, or a place nothing can be written, is
# one line now rather than a traceback from the compiler minutes later.
writable_folder() {  # NAME VALUE
  local at="$2"
  [ ! -e "$at" ] || [ -d "$at" ] || fail "$1='$2' is a file; point it at a folder (or unset it)"
  while [ ! -e "$at" ]; do at="$(dirname "$at")"; done
  [ -d "$at" ] || fail "$1='$2' lies inside the file '$at'; point it at a folder (or unset it)"
  [ -w "$at" ] || fail "$1='$2': '$at' is not writable (read-only or not yours); point it at a writable folder (or unset it)"
}
for var in TORCHNLQ_CACHE TORCHINDUCTOR_CACHE_DIR TIKTOKEN_CACHE_DIR HF_HOME TMPDIR_OVERRIDE; do
  if [ -n "${!var:-}" ]; then writable_folder "$var" "${!var}"; fi
done
writable_folder TORCHNLQ_CACHE "$CACHE"
export TORCHNLQ_MAKE_TMPDIR=1  # torchnlq.train makes $TMPDIR after its config checks

if [ "$NGPU" = 1 ] && [ -z "$multinode" ]; then
  exec "$PYTHON" -m torchnlq.train "${config[@]}" "$@"
fi
# Config and data mistakes as one line here, rather than inside torchrun's multi-rank report.
TORCHNLQ_WORLD_SIZE=$((NGPU * ${NNODES:-1})) "$PYTHON" -m torchnlq.train --preflight "${config[@]}" "$@" || exit $?
mkdir -p "$TMPDIR"
rdzv=(--standalone)
if [ -n "$multinode" ]; then
  rdzv=(--nnodes "$NNODES" --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT")
fi
stop=()
[ -z "${STOP_TIMEOUT:-}" ] || stop=(--shutdown-timeout "$STOP_TIMEOUT")
# torchrun's launcher, ending in one error: line (or the resume hint after a signal): torchnlq/train/launch.py
exec "$PYTHON" -m torchnlq.train.launch "${rdzv[@]}" --nproc_per_node "$NGPU" \
  "${stop[@]}" --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m torchnlq.train "${config[@]}" "$@"
