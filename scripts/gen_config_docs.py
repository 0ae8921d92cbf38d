"""Regenerate the options reference in docs/configs.md from the config dataclasses.

Usage: python scripts/gen_config_docs.py   (a test fails when the file is stale)
"""

from __future__ import annotations

from pathlib import Path

from torchnlq.config.checks import registry_choices
from torchnlq.config.render import markdown_reference

BEGIN, END = "<!-- BEGIN GENERATED OPTIONS -->", "<!-- END GENERATED OPTIONS -->"


def main() -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "configs.md"
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown_reference(registries=registry_choices())}{END}{tail}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
