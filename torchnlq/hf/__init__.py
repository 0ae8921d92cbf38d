"""Hugging Face transformers models of every torchnlq query type.

- :mod:`torchnlq.hf.modeling_torchnlq`: ``TorchnlqConfig`` and ``TorchnlqForCausalLM``, self-contained
  (torch + transformers only), copied into every export for ``trust_remote_code=True``;
- :mod:`torchnlq.hf.export`: :func:`~torchnlq.hf.export.export_hf`, ``convert_checkpoint.py --format hf``;
- :mod:`torchnlq.hf.auto`: registration with ``AutoConfig`` / ``AutoModelForCausalLM``, done by
  ``import torchnlq`` as soon as transformers is imported.

Nothing is imported here: ``import torchnlq`` stays free of torch and transformers.
"""
