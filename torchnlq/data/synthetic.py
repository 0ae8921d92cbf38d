"""The offline corpus for the debug run, generated from a seed by this code.

Byte-tokenized stories from a small grammar with structure at several ranges (docs/data.md).
"""

from __future__ import annotations

import json

import random
from pathlib import Path

import numpy as np

from torchnlq.data import token_format as fmt
from torchnlq.data.token_file import TokenFile
from torchnlq.data.tokenizer import ByteTokenizer
from torchnlq.errors import UserError
from torchnlq.files import make_folder

GENERATOR_VERSION = 1  # bump when the grammar changes: the corpus is regenerated
TRAIN_BYTES = 1_500_000
VAL_BYTES = 75_000

NOUNS = (
    "fox dog cat bird king queen farmer child horse wolf bear owl fish frog mouse lion "
    "goat duck sailor baker miller hunter witch giant rabbit crow snake tiger monk knight girl boy"
).split()
ADJECTIVES = "quick lazy small big old young wise happy sad dark bright quiet loud brave shy clever".split()
VERBS = (
    "sees likes chases finds helps follows watches calls feeds meets hears fears loves visits greets carries"
).split()
PLACES = "river forest hill village castle garden field lake cave market bridge tower meadow harbor".split()
COLORS = "red blue green white black yellow grey brown".split()
NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen"
).split()


class _Grammar:
    """Sentences and stories from one seeded random stream."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        # World facts fixed per seed: each noun's colour and home never change.
        self.color = {n: self.rng.choice(COLORS) for n in NOUNS}
        self.home = {n: self.rng.choice(PLACES) for n in NOUNS}

    def sentence(self, hero: str, friend: str) -> str:
        r, c = self.rng, self.rng.choice
        kind = r.random()
        if kind < 0.15:
            return f"the {hero} is {self.color[hero]}."
        if kind < 0.27:
            return f"the {hero} lives in the {self.home[hero]}."
        if kind < 0.55:
            return f"the {c(ADJECTIVES)} {hero} {c(VERBS)} the {c(ADJECTIVES)} {friend}."
        if kind < 0.72:
            return f"the {friend} {c(VERBS)} the {hero} near the {c(PLACES)}."
        if kind < 0.85:
            a, b = r.randrange(10), r.randrange(10)
            return f"{NUMBERS[a]} and {NUMBERS[b]} make {NUMBERS[a + b]}."
        return f"then the {hero} goes to the {c(PLACES)} with the {friend}."

    def story(self) -> bytes:
        hero, friend = self.rng.sample(NOUNS, 2)
        n = self.rng.randint(4, 10)
        return " ".join(self.sentence(hero, friend) for _ in range(n)).encode("ascii")


def _split_tokens(grammar: _Grammar, target_bytes: int) -> np.ndarray:
    """Stories until ``target_bytes`` text bytes, as byte tokens each followed by the eot id."""
    docs: list[bytes] = []
    size = 0
    while size < target_bytes:
        docs.append(grammar.story())
        size += len(docs[-1])
    # 0xFF never occurs in ASCII text, so it can stand for the eot id while joining bytes.
    raw = np.frombuffer(b"\xff".join(docs) + b"\xff", dtype=np.uint8).astype(fmt.DTYPE)
    raw[raw == 0xFF] = ByteTokenizer.eot_id
    return raw


def generate_synthetic_tokens(seed: int = 0) -> dict[str, np.ndarray]:
    """The corpus in memory: {'train', 'val'} uint16 byte-token arrays, a pure function of the seed."""
    grammar = _Grammar(seed)
    return {split: _split_tokens(grammar, size) for split, size in (("train", TRAIN_BYTES), ("val", VAL_BYTES))}


def unigram_entropy(tokens: TokenFile | np.ndarray | str | Path) -> float:
    """Entropy (nats) of the token frequencies: the loss of the best context-free predictor."""
    arr = tokens.tokens if isinstance(tokens, TokenFile) else tokens
    if isinstance(arr, (str, Path)):
        arr = TokenFile(arr).tokens
    counts = np.zeros(0, dtype=np.int64)
    chunk = 1 << 24  # bincount widens to int64: count in chunks so large files fit in memory
    for i in range(0, len(arr), chunk):
        c = np.bincount(np.asarray(arr[i : i + chunk]), minlength=len(counts))
        c[: len(counts)] += counts
        counts = c
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def ensure_synthetic_corpus(path: str | Path, seed: int = 0) -> Path:
    """Write the synthetic corpus into ``path`` unless already there (atomic).

    Only into a new or empty folder, or one holding a synthetic corpus torchnlq wrote (its meta.json says so):
    anything else there (another tool's token files, any file) is the user's data, refused, never overwritten.
    """
    folder = Path(path).expanduser()
    held = sorted(p.name for p in folder.iterdir() if ".tmp-" not in p.name) if folder.is_dir() else []
    if held:  # temporaries of an interrupted write (fmt.temp_name) are ours
        try:  # the meta.json source of a synthetic corpus torchnlq wrote, else anyone's
            source = json.loads((folder / fmt.META_NAME).read_text(encoding="utf-8")).get("source")
        except (OSError, ValueError, AttributeError):
            source = None
        if not (isinstance(source, dict) and source.get("kind") == "synthetic"):
            raise UserError(
                f"data.path '{folder}' holds files torchnlq did not write as its synthetic corpus "
                f"({', '.join(held[:3])}); "
                "data.synthetic = true writes only into a new or empty folder: set data.synthetic = false to train "
                "on that folder's token files, or point data.path elsewhere"
            )
        if fmt.is_complete(folder) and source.get("seed") == seed and source.get("version") == GENERATOR_VERSION:
            return folder
    make_folder(folder)
    splits = generate_synthetic_tokens(seed)  # val drawn after train, from one generator
    docs = {s: int(np.count_nonzero(a == ByteTokenizer.eot_id)) for s, a in splits.items()}  # one eot id per story
    source = {
        "kind": "synthetic",
        "seed": seed,
        "version": GENERATOR_VERSION,
        "unigram_entropy_nats": {s: round(unigram_entropy(a), 6) for s, a in splits.items()},
    }
    largest = {s: int(a.max()) for s, a in splits.items()}
    meta = fmt.make_meta(ByteTokenizer().describe(), {s: len(a) for s, a in splits.items()}, docs, source,
                         max_token_id=largest)
    temps = {s: fmt.temp_name(fmt.split_file(folder, s)) for s in splits}
    try:
        for split, arr in splits.items():
            fmt.write_tokens(temps[split], len(arr), [arr])
        fmt.commit(folder, temps, meta)
    except BaseException:
        fmt.remove_temps(temps.values())
        raise
    return folder
