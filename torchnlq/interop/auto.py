"""Registration of torchnlq's transformers classes with the Auto API: one explicit call.

Importing torchnlq registers nothing; :func:`register_auto_classes` (or ``import torchnlq.hf``) does.
"""

from __future__ import annotations

import sys
from pathlib import Path


def register_auto_classes() -> None:
    """Register TorchnlqConfig and TorchnlqForCausalLM with AutoConfig / AutoModelForCausalLM; idempotent."""
    from torchnlq.parallel.float8 import quiet_torchao_import

    # Another folder named torchnlq (the working directory's, first on sys.path) shadowing the installed package:
    # say so, instead of registering beside the wrong module.
    package = Path(__file__).resolve().parents[1]
    found = [Path(p).resolve() for p in getattr(sys.modules.get("torchnlq"), "__path__", [])]
    if package not in found:
        raise ImportError(f"a local folder '{found[0] if found else 'torchnlq'}' shadows the installed torchnlq "
                          f"package ({package}): Python imports it as torchnlq; run Python from another folder or "
                          "rename that one")

    with quiet_torchao_import():  # transformers imports torchao, whose CUDA-only libraries complain on a CPU
        from transformers import AutoConfig, AutoModelForCausalLM

        from torchnlq.interop.modeling_torchnlq import TorchnlqConfig, TorchnlqForCausalLM

    # exist_ok: a second call replaces the entry with the same classes.
    AutoConfig.register(TorchnlqConfig.model_type, TorchnlqConfig, exist_ok=True)
    AutoModelForCausalLM.register(TorchnlqConfig, TorchnlqForCausalLM, exist_ok=True)
