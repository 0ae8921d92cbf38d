"""torchnlq: pretraining transformers with nonlinear attention queries."""

__version__ = "0.1.0"
