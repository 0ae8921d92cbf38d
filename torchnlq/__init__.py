"""torchnlq: pretraining transformers with nonlinear attention queries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchnlq.models.decoder import Decoder

from torchnlq.version import __version__

# Importing torchnlq has no side effects: `import torchnlq.hf` registers the transformers classes.

__all__ = ["__version__", "load_pretrained"]


def load_pretrained(path: Any, device: Any = "cpu") -> Decoder:
    """The Decoder stored in a checkpoint folder or a safetensors export, in eval mode, fp32, on ``device``.

    Imports torch only when called, so ``import torchnlq`` stays light.
    See :func:`torchnlq.interop.load.load_model` for the metadata too.
    """
    from torchnlq.interop.load import load_model

    return load_model(path, device).model
