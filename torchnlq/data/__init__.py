"""Data: tokenizers, token-file preparation, the pre-drawn batch schedule, the synthetic corpus.

Import from the submodules (``torchnlq.data.tokenizer``, ``.prepare``, ``.batches``, ``.loader``...):
the package imports none of them, so ``prepare`` pulls in Hugging Face ``datasets`` only when asked for.
"""
