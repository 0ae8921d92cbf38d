"""Benchmarks of torchnlq, each run from the checkout as ``python -m benchmarks.NAME`` (docs/performance.md).

Not installed with torchnlq, and the library never imports this package.
"""
