"""Regenerate the options reference in docs/configs.md and the suite file's keys in docs/experiments.md from their
dataclasses.

Usage: python scripts/gen_config_docs.py [--check]   (a test fails when the file is stale)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.train.registries import registry_choices
from torchnlq.config.render import markdown_reference
from torchnlq.experiments.suite_command import suite_reference

BEGIN, END = "<!-- BEGIN GENERATED OPTIONS -->", "<!-- END GENERATED OPTIONS -->"
#: The suite file's keys in docs/experiments.md.
SUITE_MARKS = ("<!-- BEGIN GENERATED SUITE KEYS -->", "<!-- END GENERATED SUITE KEYS -->")


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Rewrite the generated tables of docs/configs.md and docs/experiments.md.")
    parser.add_argument("--check", action="store_true", help="only check: exit 1 when the file is stale, write nothing")
    opts = parser.parse_args(argv)
    docs = Path(__file__).resolve().parents[1] / "docs"
    stale = 0
    generated = ((docs / "configs.md", (BEGIN, END), markdown_reference(registries=registry_choices())),
                 (docs / "experiments.md", SUITE_MARKS, suite_reference()))
    for path, (begin, end), table in generated:
        text = path.read_text()
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        new = f"{head}{begin}\n{table}{end}{tail}"
        if opts.check:
            print(f"{path} is {'up to date' if new == text else 'stale: run python scripts/gen_config_docs.py'}")
            stale += new != text
        elif new != text:
            path.write_text(new)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
