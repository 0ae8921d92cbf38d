"""Registration of torchnlq's transformers classes with the Auto API: one explicit call.

After :func:`register_auto_classes`, ``AutoConfig`` knows ``model_type: "torchnlq"`` and
``AutoModelForCausalLM.from_pretrained(folder)`` loads a ``--format hf`` export with torchnlq's
installed classes, without ``trust_remote_code``. Importing torchnlq registers nothing (no import
hooks, no global state in other libraries); ``import torchnlq.hf`` is the one-line spelling.
"""

from __future__ import annotations


def register_auto_classes() -> None:
    """Register TorchnlqConfig and TorchnlqForCausalLM with AutoConfig / AutoModelForCausalLM; idempotent."""
    from torchnlq.parallel.float8 import quiet_torchao_import

    with quiet_torchao_import():  # transformers imports torchao, whose CUDA-only libraries complain on a CPU
        from transformers import AutoConfig, AutoModelForCausalLM

        from torchnlq.interop.modeling_torchnlq import TorchnlqConfig, TorchnlqForCausalLM

    # exist_ok: a second call replaces the entry with the same classes.
    AutoConfig.register(TorchnlqConfig.model_type, TorchnlqConfig, exist_ok=True)
    AutoModelForCausalLM.register(TorchnlqConfig, TorchnlqForCausalLM, exist_ok=True)
