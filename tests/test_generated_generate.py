"""Generated mistakes (Hypothesis) for generate.py: any source, prompt (text that is not UTF-8 included),
sampling options, device and tiktoken file.

The invariant (tests/helpers/generated_tools.py): exit 0 with the prompt and its continuation, or exit 2 with one
``error:`` line; generate writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_generated import assert_outcome

from helpers.checkpoints import load_script
from helpers.data import SHARED_GPT2
from helpers.generated_tools import (  # noqa: F401 - model_files, no_tiktoken_download: fixtures
    DEVICES, FLOAT_TEXT, SETTINGS, SOURCES, call, int_text, model_files, no_tiktoken_download, source_path, tree,
    varied,
)


HAVE_GPT2 = SHARED_GPT2.is_file()


GOOD_GENERATE = {"source": "ckpt", "prompt": "To be", "options": {"max-new-tokens": "5"}, "huge": None,
                 "temperature": None, "device": "cpu", "tiktoken": None}
GENERATE = varied(GOOD_GENERATE, {
    "source": SOURCES,
    "prompt": st.none() | st.sampled_from(["", "a", "To be", "ü€", "a" * 40, "\udcff", "\x00"])
    | st.text(max_size=6),
    "options": st.dictionaries(
        st.sampled_from(["max-new-tokens", "temperature", "top-k", "seed"]),
        int_text(high=12, huge=False),
        max_size=3),
    "huge": st.none() | st.sampled_from(["max-new-tokens", "top-k", "seed"]),
    "temperature": st.none() | FLOAT_TEXT,
    "device": DEVICES,
    "tiktoken": st.none() | st.sampled_from(["missing"] + (["shared"] if HAVE_GPT2 else [])),
})


@settings(max_examples=40, **SETTINGS)
@given(GENERATE)
@example(GOOD_GENERATE)
@example({**GOOD_GENERATE, "temperature": "1e-45"})  # logits / T overflow float32: greedy is the limit
@example({**GOOD_GENERATE, "temperature": "1e308"})  # T itself overflows float32
@example({**GOOD_GENERATE, "prompt": "\udcff"})  # a command-line byte that is not UTF-8 (surrogateescape)
@example({**GOOD_GENERATE, "source": "export", "huge": "max-new-tokens"})
def test_generate_any_options_sample_or_are_one_line(model_files: Path, draw: dict) -> None:
    script = load_script("generate")
    argv = [source_path(model_files, draw["source"])]
    argv += [f"--prompt={draw['prompt']}"] if draw["prompt"] is not None else []
    options = dict(draw["options"])
    if draw["huge"]:
        options[draw["huge"]] = "99999999999999999999" if draw["huge"] == "seed" else "1000000000000"
    if draw["temperature"] is not None:
        options["temperature"] = draw["temperature"]
    argv += [f"--{k}={v}" for k, v in options.items()] + [f"--device={draw['device']}"]
    if draw["tiktoken"]:
        argv.append(f"--tiktoken-file={model_files / 'nowhere' if draw['tiktoken'] == 'missing' else SHARED_GPT2}")
    before = tree(model_files)
    code, stdout, err = call(script.main, argv)
    assert_outcome(code, err)
    assert tree(model_files) == before
    if code == 0:  # the prompt, then the continuation
        assert stdout.startswith(draw["prompt"] or "") and stdout.endswith("\n")
