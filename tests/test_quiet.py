"""A clean run says nothing on stderr that is not about the user's run (issue 40.5).

The common commands run as a user runs them, in processes of their own (a warning filter or a logger set by
another test cannot hide anything): the debug run, a checkpoint exported as safetensors and as a Hugging Face
folder, and that folder loaded in transformers with torchnlq (``import torchnlq.hf``) and without it
(``trust_remote_code=True``). Each must leave stderr empty. transformers' own progress bar of the weights it
loads is switched off with huggingface_hub's setting (HF_HUB_DISABLE_PROGRESS_BARS): it is a progress display,
not a warning.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT, WITHOUT_TORCHNLQ
from helpers.train import run_train, script_env

pytestmark = pytest.mark.integration  # trainer runs, scripts and transformers in subprocesses


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The debug run (train_configs/debug_model.toml), shortened, saving its last step."""
    tmp = tmp_path_factory.mktemp("quiet")
    proc = run_train(tmp, "--training.steps=20", "--checkpoint.enabled", "--checkpoint.interval=20")
    return tmp, proc


def python(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**script_env(tmp), "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": str(tmp / "hf")}
    return subprocess.run([sys.executable, *argv], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def hf_export(debug_run: tuple[Path, subprocess.CompletedProcess]) -> Path:
    tmp, proc = debug_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = python(tmp, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"),
                  "outputs/debug_model/checkpoints/step-20", "exports/debug_hf", "--format", "hf")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return tmp / "exports" / "debug_hf"


def test_the_debug_run_prints_nothing_on_stderr(debug_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    tmp, proc = debug_run
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert "step     20/20" in proc.stdout


def test_an_export_prints_nothing_on_stderr(debug_run: tuple[Path, subprocess.CompletedProcess],
                                            hf_export: Path) -> None:
    tmp, _ = debug_run
    done = python(tmp, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"),
                  "outputs/debug_model/checkpoints/step-20", "exports/debug_st")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp / "exports" / "debug_st" / "model.safetensors").is_file() and (hf_export / "config.json").is_file()


LOAD = """
import sys
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], {options})
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
ids = tokenizer("The cat", return_tensors="pt").input_ids
print(model(ids).logits.shape[-1], ids.tolist())
"""


def test_a_transformers_load_with_torchnlq_prints_nothing_on_stderr(hf_export: Path) -> None:
    done = python(hf_export.parent, "-c", "import torchnlq.hf\n" + LOAD.format(options=""), str(hf_export))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split()[0] == "320"  # the byte vocabulary, padded to a multiple of 64: the model's logits


def test_a_transformers_load_without_torchnlq_prints_nothing_on_stderr(hf_export: Path) -> None:
    """torchao, when installed, prints "Failed to load ..._C_cutlass_90a.abi3.so" and two torch.utils._pytree
    deprecations when transformers first imports it, at the first model load."""
    done = python(hf_export.parent, "-c", WITHOUT_TORCHNLQ + LOAD.format(options="trust_remote_code=True"),
                  str(hf_export))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr


def test_the_docs_snippet_quiets_torchaos_import_for_a_standard_hf_folder(tmp_path: Path) -> None:
    """docs/checkpoints.md's snippet (taken from the docs, run as written on a Llama folder transformers saved):
    stderr stays empty; without it, an installed torchao that cannot load its kernels prints on stderr."""
    import importlib.util
    import re

    text = (REPO_ROOT / "docs" / "checkpoints.md").read_text()
    block = re.search(r"\n\n((?:    .*\n)+)", text[text.index("**Lines on stderr that are not the export's.**"):])
    snippet = "\n".join(line[4:] for line in block.group(1).splitlines())
    assert 'from_pretrained("exports/run-llama")' in snippet
    save = ("import torch, transformers\ntorch.manual_seed(0)\ntransformers.LlamaForCausalLM(transformers.LlamaConfig("
            "vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, "
            "num_key_value_heads=1)).save_pretrained('exports/run-llama')\n")
    done = python(tmp_path, "-c", WITHOUT_TORCHNLQ + save)
    assert done.returncode == 0, done.stderr[-2000:]
    quiet = python(tmp_path, "-c", WITHOUT_TORCHNLQ + snippet)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-3000:]
    plain = python(tmp_path, "-c", WITHOUT_TORCHNLQ + snippet.split("\n", 3)[-1])  # the same load, loggers left
    assert plain.returncode == 0, plain.stderr[-3000:]
    if importlib.util.find_spec("torchao") is not None and "Failed to load" in plain.stderr:
        assert "torchao" in plain.stderr  # what the snippet quieted came from torchao's import
