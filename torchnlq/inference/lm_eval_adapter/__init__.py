"""torchnlq models in EleutherAI's lm-evaluation-harness (the ``lm-eval`` package).

``python -m torchnlq.inference.lm_eval_adapter ARGS`` is lm-eval's command line after the import
that registers ``torchnlq`` (lm-eval 0.4 reads no other package's entry points). Attributes are
imported lazily, so this package imports without lm-eval and the CLI can say how to install it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODEL_NAME", "TorchnlqLM"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from torchnlq.inference.lm_eval_adapter import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
