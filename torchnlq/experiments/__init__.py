"""Experiments over many runs: suites, run comparison tables and plots."""
