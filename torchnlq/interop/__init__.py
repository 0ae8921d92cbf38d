"""Everything that crosses into other ecosystems: safetensors and Hugging Face exports, the transformers
wrapper around ``torchnlq.models`` (shipped with the package's own files), GPT-2 mappings, reading
Hugging Face folders (initial load, upcycling) and the tokenizer files of exports.

Nothing is imported here; :func:`torchnlq.interop.auto.register_auto_classes` (or ``import torchnlq.hf``)
registers the transformers classes.
"""
