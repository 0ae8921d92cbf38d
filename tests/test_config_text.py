"""Text that is not quite what was expected, and environment that names an unusable place (issue 31, items 4-5).

A config file saved with a UTF-8 byte-order mark reads as the same config; a key with an invisible or non-ASCII
character, wherever it is drawn into whichever option, is one error naming the character's code point (an error
message cannot show a zero-width space); a tiktoken path that is a folder names the file inside it;
run_train.sh refuses a cache or temporary folder it cannot write into, and says when the CONFIG_FILE
environment variable is not the config it runs.
"""

from __future__ import annotations

import os
import subprocess
import unicodedata
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchnlq.config.job_config import JobConfig
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import iter_options, to_toml
from torchnlq.errors import ConfigError, UserError

OPTIONS = sorted(name for name, _, _ in iter_options(JobConfig()) if "." in name)
#: Characters that look like nothing or like an ASCII letter: what a copy from a web page or chat brings along.
STRAY = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00a0", "\u2009", "\u0430", "\u0435", "\u03bf", "\u00e9"]


def test_a_bom_config_reads_as_the_same_config(tmp_path: Path) -> None:
    source = REPO_ROOT / "train_configs" / "gpt_small_res_gelu.toml"
    plain = tmp_path / "plain.toml"
    plain.write_text(to_toml(load_job_config([str(source)])), encoding="utf-8")
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert to_toml(load_job_config([str(bom)])) == plain.read_text(encoding="utf-8")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(OPTIONS), char=st.sampled_from(STRAY), data=st.data(),
       where=st.sampled_from(["flag", "quoted key"]))
def test_a_stray_character_in_any_key_is_named_by_its_code_point(option: str, char: str, data: st.DataObject,
                                                                 where: str, tmp_path: Path) -> None:
    at = data.draw(st.integers(0, len(option)), label="position")
    key = option[:at] + char + option[at:]
    if where == "flag":
        argv = [f"--{key}=1"]
    else:
        section, name = key.rsplit(".", 1)
        config = tmp_path / "stray.toml"
        config.write_text(f'["{section}"]\n"{name}" = 1\n' if "." not in section else
                          f'[{".".join(chr(34) + p + chr(34) for p in section.split("."))}]\n"{name}" = 1\n',
                          encoding="utf-8")
        argv = [str(config)]
    with pytest.raises(ConfigError) as caught:
        load_job_config(argv)
    message = str(caught.value)
    assert f"U+{ord(char):04X} ({unicodedata.name(char)})" in message and "\n" not in message
    assert char not in message  # named, never printed invisibly


def test_a_tiktoken_path_that_is_a_folder_names_the_file_inside(tmp_path: Path) -> None:
    from torchnlq.data.tokenizer import GPT2Tokenizer

    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "gpt2.tiktoken").write_text("not read\n")
    with pytest.raises(UserError, match=r"is a folder; name the file itself, e.g. '.*ranks/gpt2.tiktoken'"):
        GPT2Tokenizer(str(tmp_path / "ranks")).encode("hello")


def run_train(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """./run_train.sh in a scratch working directory (its default cache folder lands there)."""
    full_env = {**os.environ, **env}
    for name in ("TORCHNLQ_CACHE", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "TIKTOKEN_CACHE_DIR", "CONFIG_FILE"):
        if name not in env:
            full_env.pop(name, None)
    return subprocess.run([str(REPO_ROOT / "run_train.sh"), *args], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration  # run_train.sh processes
def test_config_file_in_the_environment_is_said_when_the_command_names_another(tmp_path: Path) -> None:
    config = str(REPO_ROOT / "train_configs" / "debug_model.toml")
    done = run_train(tmp_path, config, "--print-config", CONFIG_FILE=str(REPO_ROOT / "train_configs/llama_debug.toml"))
    assert done.returncode == 0
    assert "the CONFIG_FILE environment variable" in done.stderr and f"the command names {config}" in done.stderr
    assert 'flavor = "debug"' in done.stdout
    alone = run_train(tmp_path, config, "--print-config")  # no variable: nothing to say
    assert alone.returncode == 0 and "CONFIG_FILE" not in alone.stderr


@pytest.mark.integration  # run_train.sh processes, a read-only tmpfs
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_cache_folder_on_a_read_only_filesystem_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)], check=True)
    try:
        for variable in ("TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "TMPDIR_OVERRIDE", "TORCHNLQ_CACHE"):
            done = run_train(tmp_path, "--training.steps=1", **{variable: str(read_only / "cache")})
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert done.returncode == 2 and lines[-1].startswith(f"error: {variable}=") and "not writable" in lines[-1]
        assert not (tmp_path / "outputs").exists()  # refused before the run made anything
    finally:
        subprocess.run(["umount", str(read_only)], check=True)
