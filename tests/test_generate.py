"""KV cache, sampling (tools/generate.py, scripts/generate.py), evaluation (tools/evaluate.py, scripts/evaluate.py)."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest
import torch

from torchnlq.data.batches import ValidationSet
from torchnlq.data.token_file import TokenFile
from torchnlq.errors import UserError
from torchnlq.models.layers import KVCache
from torchnlq.inference.evaluation import evaluate_source
from torchnlq.interop.export import export_safetensors
from torchnlq.interop.load import load_model
from torchnlq.inference.sampling import STOP_CONTEXT, STOP_EOT, STOP_LENGTH, generate_text, generate_tokens
from torchnlq.train.validate import evaluate

from helpers.data import SHARED_GPT2, needs_gpt2, write_toy_tiktoken
from helpers.checkpoints import SEQ_LEN, VALIDATION, load_script, tiny_model, write_byte_data, write_checkpoint

QUERY_TYPES = ("linear", "identity", "residual", "residual_mlp")
CACHE_CASES = list(itertools.product(QUERY_TYPES, ("learned", "rope"), (None, 2, 1)))


# ---------------------------------------------------------------- KV cache

@pytest.mark.parametrize("qtype,positions,n_kv", CACHE_CASES)
def test_kv_cache_matches_full_forward(qtype, positions, n_kv):
    model = tiny_model(qtype, positions=positions, n_kv_heads=n_kv, init_std=0.2)
    tokens = torch.randint(0, 257, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache.for_model(model)
        # A prefill from 0 (is_causal), a multi-token chunk after cached positions (explicit mask),
        # then one token at a time (no mask).
        parts = [model(tokens[:, :9], cache=cache), model(tokens[:, 9:14], cache=cache)]
        parts += [model(tokens[:, i : i + 1], cache=cache) for i in range(14, 30)]
    assert cache.get_seq_length() == 30
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)


def test_kv_cache_refuses_positions_past_the_context():
    model = tiny_model()
    cache = KVCache.for_model(model)
    with torch.no_grad():
        model(torch.zeros(1, 31, dtype=torch.long), cache=cache)
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="exceeds the model's max_seq_len=32"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


# ---------------------------------------------------------------- sampling

def test_sampling_is_deterministic_per_seed():
    model = tiny_model(init_std=0.5)
    prompt = [72, 101, 108]
    a = generate_tokens(model, prompt, 20, temperature=1.0, seed=3)
    b = generate_tokens(model, prompt, 20, temperature=1.0, seed=3)
    c = generate_tokens(model, prompt, 20, temperature=1.0, seed=4)
    assert a == b and len(a.new_tokens) == 20 and a.stop_reason == STOP_LENGTH
    assert a.new_tokens != c.new_tokens


def test_sampling_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    generate_tokens(tiny_model(), [1, 2], 5, seed=0)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_greedy_equals_argmax_of_full_forward(positions):
    model = tiny_model("residual_mlp", positions=positions, init_std=0.3)
    prompt = [5, 80, 17, 200]
    result = generate_tokens(model, prompt, 12, temperature=0.0)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert result.new_tokens == seq[len(prompt):]
    # top_k = 1 leaves only the argmax to sample, whatever the seed.
    assert generate_tokens(model, prompt, 12, temperature=0.7, top_k=1, seed=9).new_tokens == result.new_tokens


def test_top_k_and_vocab_limit_restrict_the_tokens():
    model = tiny_model(init_std=0.5)
    with torch.no_grad():
        allowed = set(model(torch.tensor([[7]]))[0, -1].topk(3).indices.tolist())
    first = {generate_tokens(model, [7], 1, temperature=2.0, top_k=3, seed=s).new_tokens[0] for s in range(20)}
    assert first <= allowed and len(first) > 1
    limited = generate_tokens(model, [7], 25, temperature=5.0, seed=1, vocab_limit=257)
    assert max(limited.new_tokens) < 257


def test_stops_when_the_context_is_full():
    model = tiny_model()  # max_seq_len 32
    result = generate_tokens(model, list(range(28)), 100, temperature=1.0, seed=0)
    # Prompt positions 0..27 and fed tokens up to position 31: 4 fed + the last one sampled from a full context.
    assert result.stop_reason == STOP_CONTEXT and len(result.new_tokens) == 5


def test_stops_at_end_of_text():
    model = tiny_model()
    first = generate_tokens(model, [3, 4], 1, temperature=0.0).new_tokens[0]
    result = generate_tokens(model, [3, 4], 10, temperature=0.0, eot_id=first)
    assert result.new_tokens == [] and result.stop_reason == STOP_EOT


def test_bad_sampling_arguments():
    model = tiny_model()
    with pytest.raises(UserError, match="temperature"):
        generate_tokens(model, [1], 3, temperature=-1)
    with pytest.raises(UserError, match="top-k"):
        generate_tokens(model, [1], 3, top_k=0)
    with pytest.raises(UserError, match="prompt has 40 tokens"):
        generate_tokens(model, [1] * 40, 3)


def test_generate_text_from_checkpoint_and_export(tmp_path):
    model = tiny_model(init_std=0.3)
    write_checkpoint(tmp_path / "ckpt", model)
    export_safetensors(tmp_path / "ckpt", tmp_path / "export")
    text, result = generate_text(tmp_path / "ckpt", "Hi", 8, temperature=0.8, top_k=50, seed=11)
    assert text.startswith("Hi") and result.prompt_tokens == [72, 105]
    assert generate_text(tmp_path / "export", "Hi", 8, temperature=0.8, top_k=50, seed=11) == (text, result)


def test_generate_script(tmp_path, capsys):
    script = load_script("generate")
    write_checkpoint(tmp_path / "ckpt", tiny_model(init_std=0.3))
    argv = [str(tmp_path / "ckpt"), "--prompt", "ab", "--max-new-tokens", "5", "--temperature", "0"]
    assert script.run_cli(script.main, argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("ab")
    assert script.run_cli(script.main, argv) == 0 and capsys.readouterr().out == out
    assert script.run_cli(script.main, [str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def _gpt2_checkpoint(tmp_path, tokenizer):
    model = tiny_model(n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16)
    return write_checkpoint(tmp_path / "ckpt", model, tokenizer=tokenizer)


@needs_gpt2
def test_gpt2_tokenizer_from_the_shared_ranks_file(tmp_path, capsys):
    ckpt = _gpt2_checkpoint(tmp_path, {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256})
    text, result = generate_text(ckpt, "Hello world", 3, temperature=0.0, tiktoken_file=str(SHARED_GPT2))
    assert text.startswith("Hello world") and result.prompt_tokens == [15496, 995]
    script = load_script("generate")
    argv = [str(ckpt), "--prompt", "x", "--tiktoken-file", str(tmp_path / "missing.tiktoken")]
    assert script.run_cli(script.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tiktoken file") and err.count("\n") == 1


def test_gpt2_tokenizer_with_a_recorded_toy_ranks_file(tmp_path):
    ranks = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    sha = hashlib.sha256(ranks.read_bytes()).hexdigest()
    ckpt = _gpt2_checkpoint(tmp_path, {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256, "tiktoken_sha256": sha})
    # No new tokens: the toy vocabulary has holes (ids 262..50255) an untrained model may sample.
    text, result = generate_text(ckpt, "the thing", 0, tiktoken_file=str(ranks))
    assert text == "the thing" and result.prompt_tokens[0] == 257  # the toy merge "the"
    other = write_toy_tiktoken(tmp_path / "other.tiktoken")
    other.write_bytes(other.read_bytes() + b"eno= 300\n")  # the same merges plus "zz": another sha256
    with pytest.raises(UserError, match="pass that file with --tiktoken-file"):
        generate_text(ckpt, "the", 1, tiktoken_file=str(other))
    # A checkpoint that carries its ranks (as the trainer's do) needs no file at all.
    (ckpt / "tokenizer.tiktoken").write_bytes(ranks.read_bytes())
    assert generate_text(ckpt, "the thing", 0) == (text, result)
    with pytest.raises(UserError, match="pass that file with --tiktoken-file"):  # the flag still overrides
        generate_text(ckpt, "the", 1, tiktoken_file=str(other))
    (ckpt / "tokenizer.tiktoken").write_bytes(other.read_bytes())  # not the recorded file
    with pytest.raises(UserError, match=r"tokenizer.tiktoken' is corrupt \(sha256"):
        generate_text(ckpt, "the", 1)


# ---------------------------------------------------------------- evaluation

def test_evaluate_equals_direct_evaluate(tmp_path):
    data = write_byte_data(tmp_path / "data")
    model = tiny_model("residual_mlp")
    write_checkpoint(tmp_path / "ckpt", model, data_path=str(data))
    val_set = ValidationSet(TokenFile(data / "val.bin"), SEQ_LEN, VALIDATION["sequences"],
                            VALIDATION["micro_batch_size"], VALIDATION["seed"])
    expected = evaluate(model, list(val_set), torch.device("cpu"))  # as the trainer calls it
    result = evaluate_source(tmp_path / "ckpt", data)
    assert (result.val_loss, result.val_loss_std) == expected
    assert result.sequences == 10 and result.tokens == 10 * SEQ_LEN and result.micro_batch_size == 3
    export_safetensors(tmp_path / "ckpt", tmp_path / "export")
    from_export = evaluate_source(tmp_path / "export", data)
    assert (from_export.val_loss, from_export.val_loss_std) == expected
    other = evaluate_source(tmp_path / "ckpt", data, sequences=4, micro_batch_size=2, seed=1, seq_len=8)
    assert other.tokens == 32 and other.val_loss != result.val_loss


def test_evaluate_needs_no_tokenizer_file_but_checks_the_ranks(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    data = write_byte_data(tmp_path / "data")
    meta = json.loads((data / "meta.json").read_text())
    meta.update(tokenizer="gpt2", tokenizer_info={"name": "gpt2", "tiktoken_sha256": "a" * 64})
    (data / "meta.json").write_text(json.dumps(meta))
    gpt2 = {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    write_checkpoint(tmp_path / "ckpt", tiny_model(), tokenizer=gpt2)  # no ranks anywhere: not needed
    assert evaluate_source(tmp_path / "ckpt", data).sequences == VALIDATION["sequences"]
    write_checkpoint(tmp_path / "other", tiny_model(), tokenizer={**gpt2, "tiktoken_sha256": "b" * 64})
    with pytest.raises(UserError, match=r"tokenized with .tiktoken ranks of sha256 aaaa.* but the model with bbbb"):
        evaluate_source(tmp_path / "other", data)


def test_evaluate_script_and_errors(tmp_path, capsys):
    data = write_byte_data(tmp_path / "data")
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    script = load_script("evaluate")
    assert script.run_cli(script.main, [str(tmp_path / "ckpt"), "--data", str(data), "--sequences", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["val_loss", "val_loss_std", "perplexity", "sequences", "tokens"]
    assert lines[3:] == ["sequences: 6", f"tokens: {6 * SEQ_LEN}"]
    with pytest.raises(UserError, match="exceeds the model's max_seq_len"):
        evaluate_source(tmp_path / "ckpt", data, seq_len=64)
    with pytest.raises(UserError, match="does not exist"):
        evaluate_source(tmp_path / "ckpt", tmp_path / "no-data")
    write_checkpoint(tmp_path / "gpt2", tiny_model(), tokenizer={"name": "gpt2", "vocab_size": 50257, "eot_id": 50256})
    with pytest.raises(UserError, match="tokenized with 'byte'"):
        evaluate_source(load_model(tmp_path / "gpt2"), data)
