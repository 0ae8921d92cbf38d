"""Hugging Face tokenizer files of exports, and the torchnlq tokenizer a model folder carries.

:func:`write_hf_tokenizer_files` writes what ``AutoTokenizer.from_pretrained`` reads (docs/checkpoints.md);
:func:`tokenizer_from_folder` rebuilds the tokenizer from a checkpoint, an export or a Hugging Face folder.
Files are read as text or JSON, never unpickled, and bounded (:func:`check_bpe_bounds`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from torchnlq.data.tokenizer import (
    ENDOFTEXT,
    GPT2_EOT_ID,
    GPT2_PATTERN,
    GPT2_TIKTOKEN_SHA256,
    TIKTOKEN_FILE_ENV,
    TOKENIZER_JSON,
    ByteTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    Tokenizer,
    check_bpe_bounds,
    parse_ranks,
    read_tokenizer_json,
)
from torchnlq.errors import UserError
from torchnlq.files import read_json

#: The GPT-2 ranks a checkpoint carries (tiktoken's ``base64 rank`` text).
TOKENIZER_RANKS_FILE = "tokenizer.tiktoken"
VOCAB_FILE = "vocab.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: What a Hugging Face tokenizer folder holds beside tokenizer.json: special tokens (BOS/EOS among them), the chat
#: template. An hf model's checkpoints carry them as they are (:func:`hf_tokenizer_files`).
HF_SIDE_FILES = (HF_TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, CHAT_TEMPLATE_FILE)
MAX_SIDE_FILE_BYTES = 4 * 2**20
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                "additional_special_tokens")
# tiktoken caches a download under sha1(its URL) in its cache folder; r50k_base holds the GPT-2 ranks.
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
_FIX = (f"set {TIKTOKEN_FILE_ENV} (or pass --tiktoken-file) to the model's .tiktoken ranks file "
        "(GPT-2's: e.g. ../shared/data/gpt2.tiktoken)")


@cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 stands for itself, the rest from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(0x100 + i) for i, b in enumerate(b for b in range(256) if b not in table)})
    return table


@cache
def char_to_byte() -> dict[str, int]:
    """The inverse of :func:`byte_to_char`."""
    return {c: b for b, c in byte_to_char().items()}


def _token_string(token: bytes) -> str:
    return "".join(byte_to_char()[b] for b in token)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ranks_text(ranks: Mapping[bytes, int]) -> bytes:
    """The ``.tiktoken`` text of ``ranks``, in rank order (the layout of tiktoken's own files)."""
    return b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def recover_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merges of a byte-level BPE, in rank order, from its ranks alone.

    A multi-byte token is the merge of the two parts its own bytes reach under the lower ranks
    (tiktoken's rule: always merge the lowest-ranked pair); one that does not come out as two
    parts is never produced, so gets no merge.
    """
    merges = []
    for token, below in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, best_rank = -1, below
            for i in range(len(parts) - 1):
                rank = ranks.get(parts[i] + parts[i + 1], below)
                if rank < best_rank:
                    best, best_rank = i, rank
            if best < 0:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


# ---------------------------------------------------------------- where the ranks of a gpt2 model come from


def expected_sha256(tokenizer_description: Mapping[str, Any]) -> str:
    """The sha256 the model's ranks file must have: the recorded one, else GPT-2's (r50k_base)."""
    return tokenizer_description.get("tiktoken_sha256") or GPT2_TIKTOKEN_SHA256


def _read_checked(path: Path, expected: str, what: str) -> bytes:
    """A ranks file whose sha256 must be ``expected``; ``what`` says where its name came from."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{what} '{path}' is unreadable ({e.strerror or e}); {_FIX}") from None
    if _sha256(data) != expected:
        raise UserError(f"{what} '{path}' has sha256 {_sha256(data)[:16]}..., not the model's ranks "
                        f"{expected[:16]}...; {_FIX}")
    return data


def _tiktoken_cache_file() -> Path | None:
    """Where tiktoken keeps a downloaded r50k_base (None when its cache is turned off)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR")
    if folder is None:
        folder = os.environ.get("DATA_GYM_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return Path(folder, hashlib.sha1(R50K_URL.encode()).hexdigest()) if folder else None  # "" turns it off


def _carried_ranks(folder: Path, desc: Mapping[str, Any]) -> tuple[bytes, Path] | None:
    """The GPT-2 ranks text a checkpoint (checked against the recorded sha256) or export carries, and its file."""
    path = folder / TOKENIZER_RANKS_FILE
    if path.is_file():
        data, expected = path.read_bytes(), expected_sha256(desc)
        if _sha256(data) != expected:
            raise UserError(
                f"'{path}' is corrupt (sha256 {_sha256(data)[:16]}..., the model recorded {expected[:16]}...); "
                f"pass the model's .tiktoken file with --tiktoken-file (generate.py), or delete it and {_FIX}"
            )
        return data, path
    if (folder / VOCAB_FILE).is_file():
        return ranks_text(ranks_from_vocab(folder / VOCAB_FILE, desc)), folder / VOCAB_FILE
    return None


def find_gpt2_ranks(desc: Mapping[str, Any], source: str | Path | None = None, tiktoken_file: str | None = None
                    ) -> tuple[bytes, Path]:
    """The ``.tiktoken`` text of a gpt2 model's ranks, found offline, and the file it came from; else a UserError
    saying how to give them. In order: ``tiktoken_file``, the ``source`` folder, $TORCHNLQ_TIKTOKEN_FILE,
    tiktoken's cache; a file named by the user or the environment must have the recorded sha256."""
    expected = expected_sha256(desc)
    if tiktoken_file:
        path = Path(tiktoken_file).expanduser()
        return _read_checked(path, expected, "tiktoken file"), path
    carried = _carried_ranks(Path(source), desc) if source is not None else None
    if carried is not None:
        return carried
    if os.environ.get(TIKTOKEN_FILE_ENV):
        path = Path(os.environ[TIKTOKEN_FILE_ENV]).expanduser()
        return _read_checked(path, expected, TIKTOKEN_FILE_ENV), path
    cached = _tiktoken_cache_file()
    if cached is not None and cached.is_file() and expected == GPT2_TIKTOKEN_SHA256:
        data = cached.read_bytes()
        if _sha256(data) == expected:  # a damaged cache entry is tiktoken's to replace, not an error here
            return data, cached
    where = f"'{source}' carries none and they" if source is not None else "they"
    which = "" if expected == GPT2_TIKTOKEN_SHA256 else f" (a .tiktoken file of sha256 {expected[:16]}...)"
    raise UserError(f"the gpt2 tokenizer needs its BPE ranks{which}: {where} were not found offline; {_FIX}")


def find_tokenizer_json(
    tokenizer_description: Mapping[str, Any], source: str | Path | None = None, tokenizer_file: str | Path | None = None
) -> bytes:
    """The tokenizer.json an ``hf`` model was trained with: ``tokenizer_file``, else the one ``source`` carries.

    Either must have the sha256 the model recorded (a file edited since gives other ids under the same
    name); none found is a UserError saying which file to put where.
    """
    return _locate_tokenizer_json(tokenizer_description, source, tokenizer_file)[0]


def _locate_tokenizer_json(desc: Mapping[str, Any], source: str | Path | None, tokenizer_file: str | Path | None
                           ) -> tuple[bytes, list[Path]]:
    """(:func:`find_tokenizer_json`'s bytes, every candidate folder whose tokenizer.json has them, first first)."""
    recorded = desc.get("tokenizer_sha256")
    candidates = [(Path(tokenizer_file).expanduser(), "data.tokenizer_file")] if tokenizer_file else []
    candidates += [(Path(source) / TOKENIZER_JSON, "the tokenizer file")] if source is not None else []
    into, changed, found = (f"'{source}'" if source is not None else "the model folder"), None, None
    folders = []
    for path, what in candidates:
        if path.is_file():
            data = read_tokenizer_json(path, what)
            if found is None and (recorded is None or _sha256(data) == recorded):
                found = data
            if data == found:
                folders.append(path.parent)
            elif found is None:
                changed = (f"'{path}' has sha256 {_sha256(data)[:16]}..., not the tokenizer.json the model was "
                           f"trained with ({str(recorded)[:16]}...); put that file back in {into}")
    if found is not None:
        return found, folders
    if changed:
        raise UserError(changed)
    want = f"the tokenizer.json of sha256 {str(recorded)[:16]}..." if recorded else "a tokenizer.json"
    found_where = f"'{source}' carries none" if source is not None else "none was given"
    raise UserError(f"the model was trained with {want}, but {found_where}; copy that file into {into} as "
                    f"{TOKENIZER_JSON}")


def hf_tokenizer_files(
    tokenizer_description: Mapping[str, Any], source: str | Path | None = None, tokenizer_file: str | Path | None = None
) -> dict[str, bytes]:
    """The files an ``hf`` model's tokenizer travels with, by name: its tokenizer.json (:func:`find_tokenizer_json`)
    and, from beside it, the special tokens and chat template of :data:`HF_SIDE_FILES` that are there (from the
    first folder holding the same tokenizer.json and any of them). Checkpoints carry them as they are; exports
    write them through :func:`carried_tokenizer_config`. A side file that is not a JSON object (or UTF-8 text) is
    one UserError naming it."""
    data, folders = _locate_tokenizer_json(tokenizer_description, source, tokenizer_file)
    files = {TOKENIZER_JSON: data}
    for folder in folders:
        side = {name: _read_side_file(folder / name) for name in HF_SIDE_FILES if (folder / name).is_file()}
        if side:
            return files | side
    return files


def _read_side_file(path: Path) -> bytes:
    """A tokenizer side file's bytes, bounded: a JSON object, or UTF-8 text (a chat template)."""
    size = path.stat().st_size
    if size > MAX_SIDE_FILE_BYTES:
        raise UserError(f"'{path}' is {size:,} bytes, more than the {MAX_SIDE_FILE_BYTES:,} torchnlq reads for a "
                        "tokenizer's special tokens or chat template; repair or remove it")
    data = path.read_bytes()
    if path.suffix == ".json":
        if not isinstance(_side_json(data, path), dict):
            raise UserError(f"'{path}' is corrupt (not a JSON object); repair or remove it")
    else:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"'{path}' is not UTF-8 text; repair or remove it") from None
    return data


def _side_json(data: bytes, path: Path) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"'{path}' is corrupt ({e}); repair or remove it") from None
    except RecursionError:
        raise UserError(f"'{path}' is nested too deeply to be a tokenizer's settings; repair or remove it") from None


def _token_text(token: Any) -> str | None:
    """A special token of a tokenizer_config.json, a string or ``{"content": ...}``, as its text."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


def _source_config(files: Mapping[str, bytes]) -> dict[str, Any]:
    """The carried tokenizer_config.json, with the special tokens of a special_tokens_map.json it lacks."""
    config = _side_json(files.get(HF_TOKENIZER_CONFIG_FILE, b"{}"), Path(HF_TOKENIZER_CONFIG_FILE))
    special = _side_json(files.get(SPECIAL_TOKENS_FILE, b"{}"), Path(SPECIAL_TOKENS_FILE))
    return {**{k: v for k, v in special.items() if k in SPECIAL_KEYS}, **config}


def carried_tokenizer_config(files: Mapping[str, bytes], eot_token: str, model_max_length: int
                             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer_config.json, special_tokens_map.json) of an export of an ``hf`` model whose tokenizer files are
    ``files`` (:func:`hf_tokenizer_files`): the source's own tokenizer config (its class, special tokens, BOS/EOS
    handling, added tokens), its special tokens map merged in, its chat_template.jinja as ``chat_template``;
    end-of-text the model's, ``model_max_length`` its context. Left out: ``auto_map`` (tokenizer code is not
    carried: the class becomes PreTrainedTokenizerFast, which reads tokenizer.json as it is) and file paths."""
    config = _source_config(files)
    if "auto_map" in config:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config = {k: v for k, v in config.items() if k not in ("auto_map", "tokenizer_file", "name_or_path")}
    if CHAT_TEMPLATE_FILE in files:
        config["chat_template"] = files[CHAT_TEMPLATE_FILE].decode("utf-8")
    if _token_text(config.get("eos_token")) != eot_token:
        config["eos_token"] = eot_token
    # Off unless the source says otherwise, so that decode gives back exactly the text.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **config,
              "model_max_length": int(model_max_length)}
    return config, {k: config[k] for k in SPECIAL_KEYS if config.get(k) is not None}


def carried_bos_id(tokenizer_description: Mapping[str, Any], source: str | Path | None, vocab_size: int
                   ) -> int | None:
    """The beginning-of-sequence id of the tokenizer an ``hf`` model's ``source`` folder carries (its config's
    ``bos_token``) when it lies in the model's vocabulary, else None (other tokenizers: GPT-2's BOS is its
    end-of-text)."""
    if tokenizer_description.get("name") != "hf" or source is None:
        return None
    files = hf_tokenizer_files(tokenizer_description, source)
    bos = _token_text(_source_config(files).get("bos_token"))
    if bos is None:
        return None
    tokenizer = _checked_hf(files[TOKENIZER_JSON], Path(source) / TOKENIZER_JSON, tokenizer_description, None)
    found = tokenizer._tok.token_to_id(bos)  # noqa: SLF001 - the tokenizers library's parse of the same file
    return found if found is not None and 0 <= found < vocab_size else None


# ---------------------------------------------------------------- writing


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_hf_tokenizer_files(tokenizer_description: Mapping[str, Any], folder: Path, model_max_length: int,
                             source: Path | None = None, tiktoken_file: str | None = None) -> None:
    """Write the Hugging Face tokenizer files of the described tokenizer into ``folder``: for gpt2 and byte a
    GPT-2-style BPE from the ranks (:func:`find_gpt2_ranks`), for hf the tokenizer.json ``source`` carries (its
    sha256 checked); nothing for a description without a name (a model made in Python)."""
    name, folder = tokenizer_description.get("name"), Path(folder)
    # Off, so that decode gives back exactly the text (the cleanup rewrites " n't" and " ,").
    common = {"model_max_length": int(model_max_length), "clean_up_tokenization_spaces": False}
    if tiktoken_file and name != "gpt2":  # a flag that would do nothing is a mistake, not a silent no-op
        raise UserError(f"--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is {name or 'unrecorded'!r}; "
                        "drop the flag")
    if not name:
        return
    if name == "hf":
        files = hf_tokenizer_files(tokenizer_description, source)  # or the line saying which file is missing
        # Rebuilt and checked against the record: the end-of-text written below is the model's.
        eot = _checked_hf(files[TOKENIZER_JSON], Path(source or ".") / TOKENIZER_JSON, tokenizer_description,
                          None).eot_token
        (folder / TOKENIZER_JSON).write_bytes(files[TOKENIZER_JSON])
        config, special = carried_tokenizer_config(files, eot, model_max_length)
        _write_json(folder / HF_TOKENIZER_CONFIG_FILE, config)
        _write_json(folder / SPECIAL_TOKENS_FILE, special)
        return
    if name == "byte":
        vocab, merges, eot = {c: b for b, c in sorted(byte_to_char().items())}, [], ByteTokenizer.eot_id
    elif name == "gpt2":
        text, where = find_gpt2_ranks(tokenizer_description, source, tiktoken_file)
        ranks = parse_ranks(text, where, _FIX)
        vocab = {_token_string(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
        merges, eot = [(_token_string(a), _token_string(b)) for a, b in recover_merges(ranks)], GPT2_EOT_ID
    else:
        raise UserError(f"unknown tokenizer '{name}' in the model's metadata; torchnlq knows gpt2, byte and hf")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as FastTokenizer

    # A GPT-2-style byte-level BPE, saved by the tokenizers library.
    tok = FastTokenizer(models.BPE({**vocab, ENDOFTEXT: eot}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex, no space prepended
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # as GPT-2's: no BOS/EOS added to an encoding
    tok.decoder = decoders.ByteLevel()
    # "special" keeps it out of decode(skip_special_tokens=True); normalized as in GPT-2's own files.
    tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=True)])
    tok.save(str(folder / TOKENIZER_JSON), pretty=False)  # compact: 1.5 MB for GPT-2, not 3.5
    tok.model.save(str(folder))  # vocab.json and merges.txt: transformers' GPT2Tokenizer reads these
    special = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    _write_json(folder / HF_TOKENIZER_CONFIG_FILE, {
        "tokenizer_class": "GPT2Tokenizer", **common, **special, "add_prefix_space": False, "add_bos_token": False,
        "added_tokens_decoder": {str(eot): {
            "content": ENDOFTEXT, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False,
            "special": True}},
    })
    _write_json(folder / SPECIAL_TOKENS_FILE, special)


# ---------------------------------------------------------------- reading back


def _read_vocab(path: Path) -> dict[str, int]:
    vocab = read_json(path, "a vocab.json", "export the model again")  # JSON, never unpickled
    if not isinstance(vocab, dict) or not all(type(v) is int and v >= 0 for v in vocab.values()):
        raise UserError(f"'{path}' is corrupt (not a JSON object of token ids); export the model again")
    return vocab


def ranks_from_vocab(path: Path, tokenizer_description: Mapping[str, Any] | None = None) -> dict[bytes, int]:
    """A GPT-2-style vocab.json -> tiktoken ranks (end-of-text left out: tiktoken adds it as special)."""
    table, ranks = char_to_byte(), {}
    for text, rank in _read_vocab(path).items():
        if text == ENDOFTEXT:
            if rank != GPT2_EOT_ID:
                raise UserError(f"'{path}' gives {ENDOFTEXT} id {rank}, not {GPT2_EOT_ID}; export the model again")
            continue
        if not text or any(c not in table for c in text):
            raise UserError(f"'{path}' is corrupt (token {text[:20]!r} is not byte-level BPE); export the model again")
        ranks[bytes(table[c] for c in text)] = rank
    check_bpe_bounds(ranks, path, _FIX)
    recorded, size = (tokenizer_description or {}).get("vocab_size"), max(max(ranks.values()), GPT2_EOT_ID) + 1
    if isinstance(recorded, int) and recorded != size:
        raise UserError(f"'{path}' holds {size} ids but the model records vocab_size {recorded}; export the model "
                        "again")
    return ranks


class CarriedGPT2Tokenizer(GPT2Tokenizer):
    """GPT-2 BPE from ranks a model folder carries (no ranks file of the user's needed)."""

    def __init__(self, text: bytes, where: str | Path) -> None:
        # Not GPT2Tokenizer.__init__: there is no file of the user's to open or check.
        import tiktoken

        self.path, self.expected_hash, self.file_sha256, self._text = str(where), None, _sha256(text), text
        self._enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=parse_ranks(text, where, _FIX),
                                      special_tokens={ENDOFTEXT: GPT2_EOT_ID})
        self.vocab_size = self._enc.n_vocab

    # The ranks travel with a pickled copy: the folder may be gone when it is unpickled.
    def __getstate__(self) -> dict[str, Any]:
        return {"text": self._text, "where": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["text"], state["where"])  # type: ignore[misc]


def _checked_hf(data: bytes, path: Path, desc: Mapping[str, Any], eot_token: str | None) -> HFTokenizer:
    """The tokenizer of a tokenizer.json's ``data`` with the end-of-text the model records (else the folder's own
    eos_token, else the usual names), whose vocabulary size and eot id must be those ``desc`` records."""
    eot = eot_token or desc.get("eot_token")
    if eot is not None:
        tokenizer = HFTokenizer(data, path, eot)
    else:  # a Hugging Face model folder: its tokenizer_config.json's eos_token (a string or {"content": ...})
        file, config = path.parent / HF_TOKENIZER_CONFIG_FILE, None
        if file.is_file():
            config = read_json(file, "a tokenizer_config.json", "repair or remove it")
        eos = config.get("eos_token") if isinstance(config, dict) else None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        eos = eos if isinstance(eos, str) and eos else None
        try:
            tokenizer = HFTokenizer(data, path, eos)
        except UserError:
            if eos is None:
                raise
            tokenizer = HFTokenizer(data, path)  # an eos_token outside the vocabulary: the usual names instead
    for key in ("vocab_size", "eot_id"):
        if isinstance(desc.get(key), int) and desc[key] != getattr(tokenizer, key):
            raise UserError(f"'{path}' gives {key} {getattr(tokenizer, key)} but the model records {desc[key]}; "
                            f"put the model's own tokenizer.json back in {path.parent}")
    return tokenizer


def tokenizer_from_folder(
    folder: str | Path, tokenizer_description: Mapping[str, Any] | None = None, *, eot_token: str | None = None
) -> Tokenizer | None:
    """The torchnlq tokenizer a checkpoint, export or Hugging Face model folder carries (same ids), or None.

    Without a description the files decide: tokenizer.tiktoken, a vocab.json (gpt2 or byte), else a tokenizer.json
    whose end-of-text is ``eot_token``, else its tokenizer_config.json's eos_token, else a usual name it holds.
    """
    folder, desc = Path(folder), dict(tokenizer_description or {})
    name = desc.get("name")
    if name is None and (folder / TOKENIZER_RANKS_FILE).is_file():
        name = "gpt2"
    elif name is None and (folder / VOCAB_FILE).is_file():
        byte_vocab = {c: b for b, c in byte_to_char().items()} | {ENDOFTEXT: ByteTokenizer.eot_id}
        name = "byte" if _read_vocab(folder / VOCAB_FILE) == byte_vocab else "gpt2"
    elif name is None and (folder / TOKENIZER_JSON).is_file():
        name = "hf"
    if name == "byte":
        return ByteTokenizer()
    if name == "hf":
        path = folder / TOKENIZER_JSON
        return _checked_hf(find_tokenizer_json(desc, folder), path, desc, eot_token) if path.is_file() else None
    carried = _carried_ranks(folder, desc) if name == "gpt2" else None
    return CarriedGPT2Tokenizer(*carried) if carried is not None else None
