#!/usr/bin/env bash
# Make torchnlq importable, creating .venv on first use. Sourced by run_train.sh
# and run_tests.sh; sets PYTHON to the interpreter to use.
#   EXTRAS=dev  also installs the test dependencies.
# The install is redone when pyproject.toml or constraints.txt change (a stamp
# file in .venv records their hash), so a pulled dependency change is picked up.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${EXTRAS:-}"
probe="import torch, torchnlq"
[ "$EXTRAS" = dev ] && probe="import torch, torchnlq, pytest"

# Probe from / so that the checkout itself (the current directory) does not make
# torchnlq look importable.
if (cd / && python3 -c "$probe" 2>/dev/null) \
   && [ "$(cd / && python3 -c 'import torchnlq,os;print(os.path.dirname(os.path.dirname(torchnlq.__file__)))')" = "$ROOT" ]; then
  PYTHON=python3   # the user installed it (editable, this checkout) themselves
  return 0 2>/dev/null || exit 0
fi

VENV="${TORCHNLQ_VENV:-$ROOT/.venv}"
stamp="$VENV/.torchnlq-install-${EXTRAS:-base}"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[torchnlq] creating virtual environment in $VENV" >&2
  python3 -m venv "$VENV" || { echo "error: could not create $VENV (python3 -m venv failed; install python3-venv)" >&2; exit 2; }
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c "$probe" 2>/dev/null; then
  torch_pin="$(grep -m1 '^torch==' "$ROOT/constraints.txt")"
  echo "[torchnlq] installing torchnlq${EXTRAS:+[$EXTRAS]} into $VENV (first use: a few minutes, 1.4-2.1 GB; pip's output follows)" >&2
  # Which torch: the pin, from the first place pip finds it. Said before the download, so it can be stopped.
  echo "[torchnlq] torch: $torch_pin (constraints.txt) from a local wheel if pip has one (find-links), else from PyPI," \
    "whose Linux x86_64 wheel is the CUDA build (about 3 GB more with its nvidia-* wheels). For the CPU-only" \
    "wheel or another CUDA version, stop (Ctrl-C) and first run: $VENV/bin/pip install $torch_pin" \
    "--index-url https://download.pytorch.org/whl/cpu (or .../whl/cu128); then this command again" >&2
  spec="$ROOT"; [ -n "$EXTRAS" ] && spec="$ROOT[$EXTRAS]"
  # pip's progress goes to stderr: stdout stays the tool's (./run_train.sh --print-config > config.toml).
  PYTHONUNBUFFERED=1 "$VENV/bin/python" -m pip install --disable-pip-version-check -c "$ROOT/constraints.txt" -e "$spec" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2 \
    || { echo "error: pip install failed (see above); fix the cause and re-run" >&2; exit 2; }
  echo "$want" > "$stamp"
  build="$("$VENV/bin/python" -c 'import torch; print(torch.__version__, "(CUDA " + torch.version.cuda + ")" if torch.version.cuda else "(CPU only)")')"
  echo "[torchnlq] installed torch $build; $VENV holds $(du -sh "$VENV" | cut -f1)" >&2
fi
PYTHON="$VENV/bin/python"
