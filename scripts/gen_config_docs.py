"""Regenerate the options reference in docs/configs.md from the config dataclasses.

Usage: python scripts/gen_config_docs.py [--check]   (a test fails when the file is stale)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.train.registries import registry_choices
from torchnlq.config.render import markdown_reference

BEGIN, END = "<!-- BEGIN GENERATED OPTIONS -->", "<!-- END GENERATED OPTIONS -->"


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Rewrite the generated options table of docs/configs.md.")
    parser.add_argument("--check", action="store_true", help="only check: exit 1 when the file is stale, write nothing")
    opts = parser.parse_args(argv)
    path = Path(__file__).resolve().parents[1] / "docs" / "configs.md"
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{markdown_reference(registries=registry_choices())}{END}{tail}"
    if opts.check:
        print(f"{path} is {'up to date' if new == text else 'stale: run python scripts/gen_config_docs.py'}")
        return 0 if new == text else 1
    path.write_text(new)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
