#!/usr/bin/env python
"""Train every run of an experiment suite, one after another, then compare them.

Usage: python scripts/run_suite.py suites/shakespeare_tiny.toml [--dry-run] [--no-compare] [--section.key value ...]
See docs/experiments.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.experiments.suite_run import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
