"""Registration of torchnlq's transformers classes with the Auto API: one explicit call.

After :func:`register_auto_classes`, ``AutoConfig`` knows ``model_type: "torchnlq"`` and
``AutoModelForCausalLM.from_pretrained(folder)`` loads a ``--format hf`` export with torchnlq's
installed classes, without ``trust_remote_code``. Importing torchnlq registers nothing (no import
hooks, no global state in other libraries); ``import torchnlq.hf`` is the one-line spelling.
"""

from __future__ import annotations

import sys
from pathlib import Path


def check_not_shadowed() -> None:
    """ImportError when ``torchnlq`` is another folder of that name (the working directory's, first on sys.path)
    while these modules come from the installed package: say so, instead of registering beside the wrong module."""
    package = Path(__file__).resolve().parents[1]
    found = [Path(p).resolve() for p in getattr(sys.modules.get("torchnlq"), "__path__", [])]
    if package not in found:
        raise ImportError(f"a local folder '{found[0] if found else 'torchnlq'}' shadows the installed torchnlq "
                          f"package ({package}): Python imports it as torchnlq; run Python from another folder or "
                          "rename that one")


def register_auto_classes() -> None:
    """Register TorchnlqConfig and TorchnlqForCausalLM with AutoConfig / AutoModelForCausalLM; idempotent."""
    from torchnlq.parallel.float8 import quiet_torchao_import

    check_not_shadowed()

    with quiet_torchao_import():  # transformers imports torchao, whose CUDA-only libraries complain on a CPU
        from transformers import AutoConfig, AutoModelForCausalLM

        from torchnlq.interop.modeling_torchnlq import TorchnlqConfig, TorchnlqForCausalLM

    # exist_ok: a second call replaces the entry with the same classes.
    AutoConfig.register(TorchnlqConfig.model_type, TorchnlqConfig, exist_ok=True)
    AutoModelForCausalLM.register(TorchnlqConfig, TorchnlqForCausalLM, exist_ok=True)
