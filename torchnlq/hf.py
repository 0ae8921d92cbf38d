"""``import torchnlq.hf``: register torchnlq's classes with transformers' Auto API (imports transformers).

The same as calling :func:`torchnlq.interop.auto.register_auto_classes`; ``import torchnlq`` alone
registers nothing.
"""

from torchnlq.interop.auto import register_auto_classes

register_auto_classes()
