"""Benchmarks of torchnlq (behind scripts/bench*.py). The library never imports this package."""
