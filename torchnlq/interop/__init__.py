"""Everything that crosses into other ecosystems: safetensors and Hugging Face exports and imports, the
transformers wrapper and tokenizer files. Nothing is imported here (``import torchnlq.hf`` registers the classes).
"""
