"""torchnlq models in EleutherAI's lm-evaluation-harness (the ``lm-eval`` package).

* :class:`~torchnlq.inference.lm_eval_adapter.model.TorchnlqLM`: an ``lm_eval.api.model.LM``
  for any torchnlq checkpoint or export (every query type). Importing it registers it in
  lm-eval's model registry under the name ``torchnlq``.
* ``python -m torchnlq.inference.lm_eval_adapter ARGS``: lm-eval's own command line with that
  model registered. lm-eval 0.4 finds models only in its own registry (it reads no entry points
  of other packages), so a plain ``lm_eval --model torchnlq`` cannot see it; this runs the same
  CLI, with the same arguments, after the import that registers it.

Attributes are imported lazily, so ``import torchnlq.inference.lm_eval_adapter`` works without
lm-eval installed and the command line can say how to install it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODEL_NAME", "TorchnlqLM"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from torchnlq.inference.lm_eval_adapter import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
