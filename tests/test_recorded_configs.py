"""A stranger's recorded config is checked before it is trusted (torchnlq/models/recorded.py).

Every JSON a user hands over that describes a model or its data (a checkpoint's torchnlq.json, an export's
or a Hugging Face folder's config.json, a data folder's meta.json, an old export's tokenizer_config.json)
is checked against one schema before anything is built from it: exact types, bounded sizes, the model it
describes sized against the machine, its weights' shapes against the config. The unit tests hold the
checker to values written out here; the catalogue rows at the end hold each loading door to the project's
rule: exit 2, one ``error:`` line that names the file and the key (or the tensor), no file changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import torch

from torchnlq.cli import run_cli
from torchnlq.data import token_format as fmt
from torchnlq.errors import ConfigError, UserError
from torchnlq.interop.export import export_hf_standard, export_safetensors
from torchnlq.interop.hf_folder import read_hf_architecture
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.models import build_model
from torchnlq.models.args import MODEL_FIELDS, QUERY_FIELDS, ModelArgs, recorded_fields
from torchnlq.models.config import Query
from torchnlq.models.moe.config import MoE
from torchnlq.models.counts import num_params
from torchnlq.models.dense.hf import GPT2, LLAMA
from torchnlq.models.hf_mapping import HFArchitecture
from torchnlq.models.layers import KVCache
from torchnlq.models.recorded import Field, check_record, check_value, integer, number

from helpers.checkpoints import BYTE_TOKENIZER, load_script, tiny_model, write_byte_data, write_checkpoint

# ---------------------------------------------------------------- the checker, against values written out here

ACCEPTED = [
    (integer(1, 10), 1, 1), (integer(1, 10), 10, 10), (integer(null=True), None, None),
    (number(above=0), 1, 1.0), (number(0, 1), 0.5, 0.5), (Field(bool), False, False), (Field(str), "", ""),
    (Field(dict, values=integer(0)), {"train": 3}, {"train": 3}),
    (Field(list, values=Field(str)), ["a"], ["a"]),
]
REFUSED = [  # (field, value, the words of the line after "invalid k: ")
    (integer(1, 10), 32.0, "32.0 is a float, not an integer from 1 to 10"),
    (integer(1, 10), "3", '"3" is a string, not an integer from 1 to 10'),
    (integer(1, 10), True, "true is a boolean, not an integer from 1 to 10"),
    (integer(1, 10), 0, "0 is not an integer from 1 to 10"),
    (integer(1, 10), 11, "11 is not an integer from 1 to 10"),
    (integer(1, 10), None, "null is null, not an integer from 1 to 10"),
    (integer(0), [], "[] is a list, not an integer of at least 0"),
    (number(above=0), 0.0, "0.0 is not a number above 0"),
    (number(above=0), float("nan"), "NaN is not a number above 0 (it is not finite)"),
    (number(), float("inf"), "Infinity is not a number (it is not finite)"),
    (number(), 10**400, "is not a number"),
    (number(), "1e-5", '"1e-5" is a string, not a number'),
    (Field(bool), 1, "1 is an integer, not true or false"),
    (Field(str, choices=("fixed", "paper")), "other", "\"other\" is not one of 'fixed', 'paper'"),
    (Field(str), "x" * 5000, "a string of 5,000 characters, more than 4,096"),
    (Field(dict), "x", '"x" is a string, not a JSON object'),
]


@pytest.mark.parametrize("field,value,result", ACCEPTED)
def test_a_value_of_its_type_and_range_is_taken(field: Field, value: Any, result: Any) -> None:
    out = check_value(value, field, "k")
    assert out == result and type(out) is type(result)


@pytest.mark.parametrize("field,value,words", REFUSED)
def test_any_other_value_is_one_line_naming_the_key(field: Field, value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_value(value, field, "k")
    assert str(e.value).startswith("invalid k: ") and words in str(e.value) and "\n" not in str(e.value)


def test_nested_objects_name_the_dotted_key_and_required_keys_must_be_there() -> None:
    schema = {"data": Field(dict, fields={"seed": integer(0, required=True)}), "files": Field(dict, values=Field(
        dict, fields={"bytes": integer(0)}))}
    assert check_record({"data": {"seed": 3, "other": "kept"}}, schema, "") == {"data": {"seed": 3, "other": "kept"}}
    with pytest.raises(ConfigError, match=r"^invalid data.seed: it is missing \(an integer of at least 0 is needed\)$"):
        check_record({"data": {}}, schema, "")
    with pytest.raises(ConfigError, match=r'^invalid files.train.bytes: "9" is a string'):
        check_record({"files": {"train": {"bytes": "9"}}}, schema, "")
    with pytest.raises(ConfigError, match="^rec has unknown keys surprise; upgrade$"):
        check_record({"surprise": 1}, schema, "rec", unknown="; upgrade")


def test_every_recorded_model_field_has_a_schema() -> None:
    """A field added to ModelArgs, Query or a family's section without its schema entry would be read unchecked."""
    assert set(MODEL_FIELDS) == {f.name for f in fields(ModelArgs)} - {"init", "query", "moe"}
    assert set(QUERY_FIELDS) == {f.name for f in fields(Query)}
    assert set(recorded_fields(MoE)) == {f.name for f in fields(MoE)}


def wrong_type(field: Field) -> Any:
    """A value of another JSON type than ``field``'s."""
    return 5 if field.kind is str else "5"


@pytest.mark.parametrize("key", sorted(MODEL_FIELDS))
def test_model_args_refuse_any_mistyped_field_by_name(key: str) -> None:
    d = ModelArgs().to_dict()
    with pytest.raises(ConfigError, match=rf"^invalid model_args\.{key}: "):
        ModelArgs.from_dict({**d, key: wrong_type(MODEL_FIELDS[key])})


@pytest.mark.parametrize("key", sorted(QUERY_FIELDS))
def test_model_args_refuse_any_mistyped_query_field_by_name(key: str) -> None:
    d = ModelArgs().to_dict()
    with pytest.raises(ConfigError, match=rf"^invalid model_args\.query\.{key}: "):
        ModelArgs.from_dict({**d, "query": {**d["query"], key: wrong_type(QUERY_FIELDS[key])}})


def test_model_args_from_json_numbers_round_trip() -> None:
    """JSON writes 10000.0 as 10000.0 but a hand-written record may say 10000: a float field takes the integer."""
    args = ModelArgs(positions="rope", rope_theta=500000.0)
    d = {**args.to_dict(), "rope_theta": 500000, "norm_eps": 1e-5}
    assert ModelArgs.from_dict(d) == args


# ---------------------------------------------------------------- sources on disk (one of each, written once)


@dataclass(frozen=True)
class Sources:
    """A checkpoint, its export, Hugging Face GPT-2 and Llama folders, a byte data folder (never written to)."""

    root: Path

    def __getattr__(self, name: str) -> Path:
        return self.root / name


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    root = tmp_path_factory.mktemp("sources")
    model = tiny_model()
    write_checkpoint(root / "ckpt", model)
    export_safetensors(load_model(root / "ckpt"), root / "export")
    export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, root, "test"), root / "gpt2", "hf-gpt2")
    llama = tiny_model(positions="rope", norm="rms", mlp_activation="swiglu", n_kv_heads=2)
    export_hf_standard(LoadedModel(llama, llama.args, BYTE_TOKENIZER, {}, root, "test"), root / "llama", "hf-llama")
    write_byte_data(root / "data")
    return Sources(root)


def edited(source: Path, dest: Path, file: str, change: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of ``source`` at ``dest`` whose JSON ``file`` went through ``change``."""
    shutil.copytree(source, dest)
    d = json.loads((dest / file).read_text())
    change(d)
    (dest / file).write_text(json.dumps(d, allow_nan=True))
    return dest


def put(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the dotted ``path`` of a JSON object to ``value``."""

    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            d = d.setdefault(part, {})
        d[last] = value

    return change


# ---------------------------------------------------------------- sizing, weights against the config, the KV cache


def test_a_model_beyond_the_machine_is_refused_before_anything_is_allocated(tmp_path: Path, sources: Sources,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine is told to hold exactly the model's fp32 weights and buffers less one byte, then exactly them."""
    import torchnlq.parallel.device_memory as memory

    args = tiny_model().args
    built = build_model(args)  # the reference: what the real model holds, counted on real tensors
    need = sum(t.numel() * t.element_size() for t in (*built.parameters(), *built.buffers()))
    assert need == 4 * num_params(args)  # learned positions: no buffers
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: need - 1)
    with pytest.raises(UserError, match=rf"torchnlq.json' describes a model of {num_params(args):,} parameters"):
        load_model(sources.ckpt)
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: need)
    assert load_model(sources.ckpt).model.num_params() == num_params(args)


def test_a_record_of_petabytes_is_one_line_at_once(tmp_path: Path, sources: Sources) -> None:
    """Types and ranges pass (a 2^32 vocabulary, 2^17 wide): the size of the model is what refuses it."""
    export = edited(sources.export, tmp_path / "export", "config.json",
                    lambda d: d["model_args"].update(vocab_size=2**32, dim=2**17, n_heads=2**10))
    with pytest.raises(UserError, match=r"describes a model of [\d,]+ parameters: [\d,.]+ GiB of fp32 weights"):
        load_model(export)


def test_weights_of_another_shape_are_one_line_naming_tensor_shapes_and_files(tmp_path: Path, sources: Sources) -> None:
    export = edited(sources.export, tmp_path / "export", "config.json", put("model_args.mlp_hidden", 64))
    with pytest.raises(UserError) as e:
        load_model(export)
    assert str(e.value) == (
        f"'{export}/model.safetensors': tensor 'layers.0.mlp.fc.weight' has shape (128, 32) but the model_args give "
        f"(64, 32) ('{export}/config.json'); the two files do not belong together")


@pytest.mark.parametrize("reader,folder,key,value,line", [
    (GPT2, "gpt2", "n_embd", 32.0, "config.json': invalid n_embd: 32.0 is a float, not an integer"),
    (GPT2, "gpt2", "n_head", 0, "config.json': invalid n_head: 0 is not an integer from 1 to 65,536"),
    (GPT2, "gpt2", "n_head", 3, "config.json': GPT-2 config n_head=3 does not divide n_embd=32"),
    (GPT2, "gpt2", "n_positions", 10**9, "invalid n_positions: 1000000000 is not an integer from 1 to"),
    (GPT2, "gpt2", "n_inner", 64, "gpt2/model.safetensors': tensor 'transformer.h.0.mlp.c_fc.weight' has "
     "shape (32, 128) but config.json gives (32, 64)"),
    (LLAMA, "llama", "hidden_size", "32", 'config.json\': invalid hidden_size: "32" is a string'),
    (LLAMA, "llama", "rope_scaling", [8], "invalid rope_scaling: [8] is a list, not a JSON object"),
    (LLAMA, "llama", "num_key_value_heads", 4, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
     "(16, 32) but config.json gives (32, 32)"),
])
def test_hugging_face_configs_are_checked_by_key_and_against_their_weights(
        tmp_path: Path, sources: Sources, reader: HFArchitecture, folder: str, key: str, value: Any, line: str) -> None:
    copy = edited(getattr(sources, folder), tmp_path / folder, "config.json", put(key, value))
    with pytest.raises(UserError) as e:
        read_hf_architecture(copy, reader)
    assert line in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_hugging_face_folders_still_read_as_written(sources: Sources) -> None:
    """The reference: the models the folders were exported from, weight for weight."""
    args, state = read_hf_architecture(sources.llama, LLAMA)
    reference = tiny_model(positions="rope", norm="rms", mlp_activation="swiglu", n_kv_heads=2)
    assert args.n_kv_heads == 2 and all(torch.equal(state[k], v) for k, v in reference.state_dict().items())
    args, state = read_hf_architecture(sources.gpt2, GPT2)  # exported after write_checkpoint's optimizer step: the checkpoint's
    reference = load_model(sources.ckpt).model.state_dict()
    assert args.bias and all(torch.equal(state[k], v) for k, v in reference.items())


def test_the_kv_cache_holds_what_the_call_can_write_not_the_recorded_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded context of 2^20 positions: the cache of 3 + 4 tokens samples what a full-size cache samples."""
    import torchnlq.inference.sampling as sampling

    model = tiny_model(positions="rope", max_seq_len=2**20)
    sizes: list[int] = []

    class Recorded(KVCache):
        def __init__(self, n_layers: int, max_len: int) -> None:
            sizes.append(max_len)
            super().__init__(n_layers, max_len)

    monkeypatch.setattr(sampling, "KVCache", Recorded)
    small = sampling.generate_tokens(model, [1, 2, 3], 4, temperature=0)
    assert sizes == [3 + 4]
    cache, tokens = KVCache(model.args.n_layers, 64), [1, 2, 3]  # the reference: greedy decoding by hand
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), cache=cache)[:, -1]
        for _ in range(4):
            tokens.append(int(logits.argmax()))
            logits = model(torch.tensor([tokens[-1:]]), cache=cache)[:, -1]
    assert small.new_tokens == tokens[3:]


def test_a_data_folder_meta_json_is_checked_by_key(tmp_path: Path, sources: Sources) -> None:
    for key, value, words in (("vocab_size", "many", 'invalid vocab_size: "many" is a string'),
                              ("tokens", {"train": "600"}, 'invalid tokens.train: "600" is a string'),
                              ("files", [], "invalid files: [] is a list, not a JSON object"),
                              ("eot_id", -1, "invalid eot_id: -1 is not an integer from 0 to")):
        folder = edited(sources.data, tmp_path / key, fmt.META_NAME, put(key, value))
        with pytest.raises(UserError) as e:
            fmt.read_meta(folder)
        assert f"meta.json': {words}" in str(e.value)


# ---------------------------------------------------------------- catalogue rows of these doors


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's sha256, or "dir"."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def call(script: str, argv: list[str]) -> tuple[int, str, str]:
    """scripts/<script>.py's main(argv) through run_cli, as its __main__ runs it: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(load_script(script).main, argv)
    return code, out.getvalue(), err.getvalue()


Setup = Callable[[Sources, Path], None]


def copy(source: str, file: str, change: Callable[[dict[str, Any]], Any], name: str = "src") -> Setup:
    return lambda s, tmp: edited(getattr(s, source), tmp / name, file, change) and None


def drop_tokenizer_into(file_change: Callable[[dict[str, Any]], Any]) -> Setup:
    """An older export: config.json records no tokenizer, tokenizer_config.json holds its description."""

    def setup(s: Sources, tmp: Path) -> None:
        edited(s.export, tmp / "src", "config.json", lambda d: d.pop("tokenizer"))
        description = dict(BYTE_TOKENIZER)
        file_change(description)
        (tmp / "src" / "tokenizer_config.json").write_text(json.dumps(description))

    return setup


ROWS: list[tuple[str, str, list[str], str, Setup]] = [
    ("generate", "checkpoint-dim-a-float", ["{tmp}/src"], "torchnlq.json': invalid model_args.dim: 32.0 is a float",
     copy("ckpt", "torchnlq.json", put("model_args.dim", 32.0))),
    ("generate", "export-n-heads-zero", ["{tmp}/src"], "config.json': invalid model_args.n_heads: 0 is not an integer",
     copy("export", "config.json", put("model_args.n_heads", 0))),
    ("generate", "checkpoint-of-petabytes", ["{tmp}/src"], "GiB of fp32 weights and buffers, more than this machine's",
     copy("ckpt", "torchnlq.json", lambda d: d["model_args"].update(vocab_size=2**32, dim=2**17))),
    ("generate", "export-seq-len-a-string", ["{tmp}/src"], 'config.json\': invalid seq_len: "32" is a string',
     copy("export", "config.json", put("seq_len", "32"))),
    ("generate", "old-export-tokenizer-config-vocab-size-a-string", ["{tmp}/src"],
     'tokenizer_config.json\': invalid tokenizer.vocab_size: "x" is a string',
     drop_tokenizer_into(put("vocab_size", "x"))),
    ("convert_checkpoint", "checkpoint-vocab-of-10-to-the-12", ["{tmp}/src", "{tmp}/out"],
     "invalid model_args.vocab_size: 1000000000000 is not an integer from 1 to 4,294,967,296",
     copy("ckpt", "torchnlq.json", put("model_args.vocab_size", 10**12))),
    ("convert_checkpoint", "export-positions-of-10-to-the-9", ["{tmp}/src", "{tmp}/out"],
     "invalid model_args.max_seq_len: 1000000000 is not an integer from 1 to 16,777,216",
     copy("export", "config.json", put("model_args.max_seq_len", 10**9))),
    ("convert_checkpoint", "export-weights-of-another-model", ["{tmp}/src", "{tmp}/out"],
     "tensor 'layers.0.mlp.fc.weight' has shape (128, 32) but the model_args give (64, 32)",
     copy("export", "config.json", put("model_args.mlp_hidden", 64))),
    ("convert_checkpoint", "export-format-version-a-string", ["{tmp}/src", "{tmp}/out"],
     "has format_version '1', not a version number", copy("export", "config.json", put("format_version", "1"))),
    ("convert_checkpoint", "checkpoint-step-negative", ["{tmp}/src", "{tmp}/out"],
     "invalid step: -7 is not an integer from 0", copy("ckpt", "torchnlq.json", put("step", -7))),
    ("evaluate", "checkpoint-micro-batch-size-x", ["{tmp}/src", "--data", "{data}"],
     'invalid validation.micro_batch_size: "x" is a string', copy("ckpt", "torchnlq.json",
                                                                  put("validation.micro_batch_size", "x"))),
    ("evaluate", "checkpoint-validation-protocol-unknown", ["{tmp}/src", "--data", "{data}"],
     "invalid validation.protocol: \"daily\" is not one of 'fixed', 'paper'",
     copy("ckpt", "torchnlq.json", put("validation.protocol", "daily"))),
    ("evaluate", "data-meta-json-token-count-a-string", ["{ckpt}", "--data", "{tmp}/src"],
     "meta.json': invalid tokens.val: \"800\" is a string", copy("data", "meta.json", put("tokens.val", "800"))),
    ("upcycle", "gpt2-n-embd-a-float", ["{tmp}/src", "{tmp}/out"], "config.json': invalid n_embd: 32.0 is a float",
     copy("gpt2", "config.json", put("n_embd", 32.0))),
    ("upcycle", "gpt2-n-head-zero", ["{tmp}/src", "{tmp}/out"], "invalid n_head: 0 is not an integer from 1",
     copy("gpt2", "config.json", put("n_head", 0))),
    ("upcycle", "gpt2-weights-of-another-config", ["{tmp}/src", "{tmp}/out"],
     "tensor 'transformer.h.0.mlp.c_fc.weight' has shape (32, 128) but config.json gives (32, 64)",
     copy("gpt2", "config.json", put("n_inner", 64))),
    ("upcycle", "llama-rope-scaling-a-list", ["{tmp}/src", "{tmp}/out"],
     "config.json': invalid rope_scaling: [8] is a list", copy("llama", "config.json", put("rope_scaling", [8]))),
    ("upcycle", "llama-intermediate-size-null", ["{tmp}/src", "{tmp}/out"],
     "invalid intermediate_size: null is null, not an integer from 1 to 1,048,576",
     copy("llama", "config.json", put("intermediate_size", None))),
]


@pytest.mark.parametrize("script,name,argv,fragment,setup", ROWS, ids=[f"{r[0]}:{r[1]}" for r in ROWS])
def test_mistake(tmp_path: Path, sources: Sources, script: str, name: str, argv: list[str], fragment: str,
                 setup: Setup) -> None:
    """Exit 2, one error line holding ``fragment``, no traceback, nothing written, changed or deleted."""
    setup(sources, tmp_path)
    before, shared = snapshot(tmp_path), snapshot(sources.root)
    code, out, err = call(script, [a.format(tmp=tmp_path, data=sources.data, ckpt=sources.ckpt) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert snapshot(tmp_path) == before and snapshot(sources.root) == shared


@pytest.fixture(autouse=True)
def _no_tiktoken_download(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    yield
