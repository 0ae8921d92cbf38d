"""The catalogue's rows of ``python scripts/gen_config_docs.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

IN_PROCESS = [
    row("gen_config_docs.py", "option-typo", ["--chek"], "--chek"),
    row("gen_config_docs.py", "file-argument", ["docs/configs.md"], "docs/configs.md"),
]

SUBPROCESS = [
    row("gen_config_docs.py", "unknown-option", ["--write"], "--write"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
