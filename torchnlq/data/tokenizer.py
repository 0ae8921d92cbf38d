"""Tokenizers: tiktoken GPT-2 (with offline file support) and a byte-level one."""

# Base (unpadded) vocabulary size of each tokenizer name; the model pads it up
# to a multiple of model.vocab_multiple. Kept here so the model can be sized
# without loading the tokenizer's files.
BASE_VOCAB_SIZE = {"gpt2": 50257, "byte": 257}
