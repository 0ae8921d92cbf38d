"""Paper-exact mode against the paper's code (arXiv 2603.13381), restated in this file.

- The identity term's 1/2 (``model.query.half_scale``): the paper's code keeps Q = X,
  X + X·W_Q, X + f(X) and attends at scale 1/(2·sqrt(head_dim)); written out by hand here.
- ``model.init = "paper"``: :func:`paper_initial_weights` repeats, in the paper's own module
  names, every draw its training script makes (``torch.manual_seed``, then its GPT's
  constructors and nanoGPT's init); torchnlq's weights must equal them bit for bit, for every
  query mode of the paper's code, in one process and sharded over two (integration).
- The schedule: the Table 1 configs take the paper's number of updates and LR at every one.

With ``TORCHNLQ_PAPER_CODE`` set to a checkout of the paper's code (github.com/MarkoKarbevski/
beyond_query_linearity), its own ``model.py`` is compared too (initial weights and logits, and the
step-0 evaluation of the paper protocol: its iteration-0 ``estimate_loss`` around its own model).

Run as a script under torchrun (``python -m torch.distributed.run --nproc_per_node 2
tests/test_paper_exact.py OUT.json``) this file is the worker of the two-process test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.paper import as_paper_state_dict, paper_initial_weights

from torchnlq.config.job_config import Query
from torchnlq.config.manager import load_job_config
from torchnlq.errors import ConfigError
from torchnlq.models import ModelArgs
from torchnlq.models.config import INIT_SCHEMES
from torchnlq.models.query import QUERY_TYPES, QueryProjection, register_query
from torchnlq.train.preflight import check_job_config
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

REPO_ROOT = Path(__file__).resolve().parents[1]
EPS = 1e-5
#: The paper code's query_mode -> torchnlq's model.query.type.
MODES = {"original": "linear", "identity": "identity", "residual": "residual", "residual_gelu": "residual_mlp"}
#: A tiny shape: layers, width, heads, vocabulary, positions, MLP hidden.
L, D, H, V, T, HIDDEN = 2, 32, 4, 72, 16, 128


# ---------------------------------------------------------------- the paper's code, restated

def paper_model_args(
    mode: str, tied: bool = True, hidden: int = HIDDEN, init: str = "paper", **query: object
) -> ModelArgs:
    return ModelArgs(n_layers=L, dim=D, n_heads=H, vocab_size=V, max_seq_len=T, mlp_hidden=hidden, tie_embeddings=tied,
                     query=Query(type=MODES[mode], **query), init=init)


def assert_bitwise(ours: dict[str, torch.Tensor], paper: dict[str, torch.Tensor]) -> None:
    assert set(ours) == set(paper)
    different = [k for k in paper if not torch.equal(ours[k], paper[k])]
    assert not different, f"not bitwise equal: {different}"


# ---------------------------------------------------------------- 1. the identity term's 1/2

def layer_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + EPS) * gain


def paper_attention(attn: nn.Module, mode: str, x: torch.Tensor, n_head: int, scale: float) -> torch.Tensor:
    """The paper's CausalSelfAttention.forward on ``attn``'s weights: q never halved, ``scale`` in the softmax."""
    sd = {k: v.detach() for k, v in attn.state_dict().items()}
    B, T_, C = x.shape
    k, v = (x @ sd["kv.weight"].T).split(C, dim=-1)
    if mode == "identity":
        q = x
    elif mode == "residual":
        q = x + x @ sd["query.w_q.weight"].T
    else:  # X + LN(GELU(RMSNorm(X) W1) W2), exact GELU
        r = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * sd["query.input_norm.weight"]
        h = r @ sd["query.w1.weight"].T
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
        q = x + layer_norm(h @ sd["query.w2.weight"].T, sd["query.output_norm.weight"])
    heads = [t.reshape(B, T_, n_head, C // n_head).transpose(1, 2) for t in (q, k, v)]
    scores = (heads[0] @ heads[1].transpose(-1, -2)) * scale
    scores = scores.masked_fill(~torch.ones(T_, T_, dtype=torch.bool).tril(), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ heads[2]
    return y.transpose(1, 2).reshape(B, T_, C) @ sd["proj.weight"].T


@pytest.mark.parametrize("mode", ["identity", "residual", "residual_gelu"])
def test_the_identity_term_attends_at_the_papers_scale(mode: str) -> None:
    """half_scale = true is the paper's scale 1/(2 sqrt(hd)) on the unhalved query; false is 1/sqrt(hd)."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, D, dtype=torch.float64) * 1.5
    hd = D // H
    outputs = {}
    for half in (True, False):
        torch.manual_seed(1)
        model = build_model(paper_model_args(mode, init="torchnlq", half_scale=half)).double()
        with torch.no_grad():
            for p in model.parameters():  # weights large enough that the scale matters, gains away from 1
                p.copy_(torch.rand_like(p) + 0.5 if p.ndim == 1 else p * 10)
        attn = model.layers[0].attn
        scale = 1 / (2 * math.sqrt(hd)) if half else 1 / math.sqrt(hd)
        outputs[half] = attn(x)
        torch.testing.assert_close(outputs[half], paper_attention(attn, mode, x, H, scale), rtol=1e-10, atol=1e-10)
    assert (outputs[True] - outputs[False]).abs().max() > 0.01 * outputs[False].abs().max()  # the knob matters


def _arms(suite: Path) -> list[tuple[str, list[str]]]:
    """(name, load_job_config argv) of every run of a suite file, as the suite runner expands it."""
    from torchnlq.experiments.suite import load_suite

    return [(run.name, run.argv()) for run in load_suite(suite).runs]


@pytest.mark.parametrize("suite", sorted((REPO_ROOT / "suites").glob("*.toml")), ids=lambda p: p.name)
def test_every_suite_arm_with_the_identity_term_uses_the_papers_scale(suite: Path) -> None:
    for name, argv in _arms(suite):
        query = load_job_config(argv).model.query
        if QUERY_TYPES[query.type].requires_full_width:
            assert query.half_scale, f"{suite.name}: {name}"


@pytest.mark.parametrize(
    "config,qtype",
    [("gpt_small_identity", "identity"), ("gpt_small_identity_paper", "identity"), ("gpt_small_residual", "residual"),
     ("gpt_small_res_gelu", "residual_mlp"), ("gpt_small_res_gelu_lr2p6e-3", "residual_mlp")],
)
def test_shipped_configs_with_the_identity_term_use_the_papers_scale(config: str, qtype: str) -> None:
    query = load_job_config([str(REPO_ROOT / "train_configs" / f"{config}.toml")]).model.query
    assert (query.type, query.half_scale) == (qtype, True)


# ---------------------------------------------------------------- 2. the paper's initial weights

PAPER_CASES = [(mode, tied, HIDDEN) for mode in MODES for tied in (True, False)]
PAPER_CASES.append(("original", True, round(4.75 * D)))  # Table 1's MLP 4.75d control


@pytest.mark.parametrize("mode,tied,hidden", PAPER_CASES)
@pytest.mark.parametrize("seed", [0, 1337])
def test_paper_init_is_bitwise_the_papers(mode: str, tied: bool, hidden: int, seed: int) -> None:
    torch.manual_seed(seed)
    model = build_model(paper_model_args(mode, tied, hidden))
    expected = paper_initial_weights(seed, mode, L, D, V, T, hidden, tied)
    assert_bitwise(as_paper_state_dict(model.state_dict(), L), expected)


def test_the_trainer_starts_from_the_papers_weights(tmp_path: Path) -> None:
    """Config -> check_job_config -> meta model -> materialize_and_init, as a one-process CPU run does it."""
    from helpers.train import tiny_config

    from torchnlq.train.trainer import Trainer

    cfg = tiny_config(tmp_path, "paper_init", model__init="paper", training__seed=1337)
    trainer = Trainer(cfg)
    a = trainer.model_args
    sd = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    expected = paper_initial_weights(1337, "residual_gelu", a.n_layers, a.dim, a.vocab_size, a.max_seq_len,
                                     a.mlp_hidden, a.tie_embeddings)
    assert_bitwise(as_paper_state_dict(sd, a.n_layers), expected)


def torchnlq_default_weights(seed: int, args: ModelArgs) -> dict[str, torch.Tensor]:
    """torchnlq's own init, restated: each parameter drawn once, in module order."""
    torch.manual_seed(seed)
    std, residual = args.init_std, args.init_std / math.sqrt(2 * args.n_layers)
    d = args.dim

    def normal(*shape: int, s: float = std) -> torch.Tensor:
        return nn.init.normal_(torch.empty(*shape), mean=0.0, std=s)

    w = {"tok_emb.weight": normal(args.vocab_size, d), "pos_emb.weight": normal(args.max_seq_len, d)}
    for i in range(args.n_layers):
        p = f"layers.{i}."
        w[p + "ln_1.weight"] = torch.ones(d)
        if args.query.type in ("linear", "residual"):
            w[p + "attn.query.w_q.weight"] = normal(d, d)
        elif args.query.type == "residual_mlp":
            w[p + "attn.query.input_norm.weight"] = torch.ones(d)
            w[p + "attn.query.w1.weight"] = normal(d // 2, d)
            w[p + "attn.query.w2.weight"] = normal(d, d // 2)
            w[p + "attn.query.output_norm.weight"] = torch.ones(d)
        w[p + "attn.kv.weight"] = normal(2 * d, d)
        w[p + "attn.proj.weight"] = normal(d, d, s=residual)
        w[p + "ln_2.weight"] = torch.ones(d)
        w[p + "mlp.fc.weight"] = normal(args.mlp_hidden, d)
        w[p + "mlp.proj.weight"] = normal(d, args.mlp_hidden, s=residual)
    w["ln_f.weight"] = torch.ones(d)
    if not args.tie_embeddings:
        w["lm_head.weight"] = normal(args.vocab_size, d)
    return w


@pytest.mark.parametrize("mode", list(MODES))
def test_the_default_init_is_unchanged(mode: str) -> None:
    args = paper_model_args(mode, tied=False, init="torchnlq")
    torch.manual_seed(3)
    ours = build_model(args).state_dict()
    expected = torchnlq_default_weights(3, args)
    assert list(ours) == list(expected)
    assert all(torch.equal(ours[k], expected[k]) for k in expected)
    torch.manual_seed(3)
    paper = build_model(paper_model_args(mode, tied=False)).state_dict()
    assert not torch.equal(paper["layers.0.mlp.fc.weight"], ours["layers.0.mlp.fc.weight"])  # another order


def test_paper_init_sets_every_parameter_of_gqa_and_rope_models() -> None:
    """Configurations the paper's code lacks get the same procedure; nothing is left from to_empty."""
    args = ModelArgs(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq_len=16, positions="rope",
                     tie_embeddings=False, query=Query(type="residual_mlp", input_norm="none"), init="paper")
    with torch.device("meta"):
        model = build_model(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    torch.manual_seed(0)
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    torch.manual_seed(0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), build_model(args).state_dict().values()))


def test_paper_init_refuses_a_parameter_it_cannot_place() -> None:
    @register_query("scaled_identity_test")
    class ScaledIdentity(QueryProjection):
        requires_full_width = True
        knobs = ("half_scale",)

        def __init__(self, cfg, shape):
            super().__init__(cfg, shape)
            self.gain = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x * self.gain

    try:
        args = ModelArgs(query=Query(type="scaled_identity_test"), init="paper")
        with pytest.raises(ConfigError, match=r"model.init = 'paper' does not know .*layers.0.attn.query.gain"):
            build_model(args)
        build_model(ModelArgs(query=Query(type="scaled_identity_test")))  # the default init knows it
    finally:
        QUERY_TYPES.pop("scaled_identity_test", None)


def test_init_is_no_part_of_the_recorded_model() -> None:
    """Checkpoints and resume fingerprints are the same for both inits (and as before the option)."""
    paper, default = paper_model_args("residual_gelu"), paper_model_args("residual_gelu", init="torchnlq")
    assert "init" not in paper.to_dict() and paper.to_dict() == default.to_dict()
    assert ModelArgs.from_dict(paper.to_dict()) == default
    with pytest.raises(ConfigError, match="unknown keys init"):
        ModelArgs.from_dict({**paper.to_dict(), "init": "paper"})


def test_init_values_come_from_one_list() -> None:
    from torchnlq.config.job_config import Model

    choices = next(f for f in Model.__dataclass_fields__.values() if f.name == "init").metadata["choices"]
    assert tuple(choices) == INIT_SCHEMES


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model.init=papr"], "model.init: 'papr' is not one of torchnlq, depth, paper; did you mean 'paper'?"),
        (["--model.init=Paper"], "model.init: 'Paper' is not one of torchnlq, depth, paper"),
        (["--model.query.half_scale=half"], "--model.query.half_scale expects true or false, got 'half'"),
    ],
)
def test_bad_values_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_job_config(argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_init_in_model_args_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^model.init: unknown 'nanogpt'"):
        ModelArgs(init="nanogpt")


# ---------------------------------------------------------------- the paper's own model.py (opt-in)

def _paper_module():
    root = os.environ.get("TORCHNLQ_PAPER_CODE")
    if not root or not (Path(root) / "model.py").is_file():
        pytest.skip("set TORCHNLQ_PAPER_CODE to a checkout of the paper's code to compare with its model.py")
    spec = importlib.util.spec_from_file_location("paper_model", Path(root) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode,tied,hidden", PAPER_CASES)
def test_against_the_papers_own_model(mode: str, tied: bool, hidden: int) -> None:
    paper = _paper_module()
    scale = 1 / (2 * math.sqrt(D // H)) if mode != "original" else 1 / math.sqrt(D // H)
    cfg = paper.GPTConfig(block_size=T, vocab_size=V, n_layer=L, num_heads=H, n_embd=D, head_size=D // H,
                          tie_weights=tied, bias=False, dropout=0.0, scale=scale, query_mode=mode,
                          mlp_hidden_size=hidden)
    torch.manual_seed(1337)
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = paper.GPT(cfg)
    torch.manual_seed(1337)
    ours = build_model(paper_model_args(mode, tied, hidden))
    assert_bitwise(as_paper_state_dict(ours.state_dict(), L), theirs.state_dict())
    tokens = torch.randint(0, V, (2, T))
    with torch.no_grad():
        logits, _ = theirs(tokens, tokens)  # with targets: logits at every position
        torch.testing.assert_close(ours(tokens), logits, rtol=1e-6, atol=1e-6)


@pytest.mark.integration  # runs the trainer
def test_the_step_0_evaluation_is_the_papers_own_at_iteration_0(tmp_path: Path) -> None:
    """train.py's estimate_loss at iteration 0, restated around the paper's own GPT at torchnlq's initial weights:
    its eval_train and eval_val figures are what a validation.protocol = "paper" run logs at step 0."""
    import numpy as np
    from helpers.data import write_token_folder
    from helpers.train import scalars, tiny_config

    from torchnlq.train.trainer import Trainer

    paper = _paper_module()
    micro, sequences = 2, 8  # train.py: batch_size, eval_iters * batch_size columns
    rng = np.random.default_rng(0)
    folder = write_token_folder(tmp_path / "data", rng.integers(0, 256, 4000), rng.integers(0, 256, 1000))
    cfg = tiny_config(
        tmp_path, "step0", steps=2, data__path=folder, data__synthetic=False, model__n_layers=L, model__dim=D,
        model__n_heads=H, model__max_seq_len=T, model__mlp_hidden=HIDDEN, model__init="paper",
        model__query__type="residual_mlp", training__seq_len=T, training__seed=1337, validation__protocol="paper",
        validation__seed=42, validation__sequences=sequences, validation__micro_batch_size=micro,
        validation__interval=1000, checkpoint__enabled=False,
    )
    trainer = Trainer(cfg)
    vocab = trainer.model_args.vocab_size
    trainer.train()
    logged = scalars(tmp_path / "outputs/step0/tb")
    config = paper.GPTConfig(block_size=T, vocab_size=vocab, n_layer=L, num_heads=H, n_embd=D, head_size=D // H,
                             tie_weights=True, bias=False, dropout=0.0, scale=1 / (2 * math.sqrt(D // H)),
                             query_mode="residual_gelu", mlp_hidden_size=HIDDEN)
    torch.manual_seed(1337)
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = paper.GPT(config).eval()
    splits = {name: np.memmap(folder / f"{name}.bin", dtype=np.uint16, mode="r") for name in ("train", "val")}
    gen = torch.Generator(device="cpu")  # Generate_Indices.ipynb, cell 2: eval_train's table, then eval_val's
    gen.manual_seed(42)
    tables = {name: torch.randint(len(splits[name]) - T, (600, sequences), generator=gen) for name in ("train", "val")}
    for name, tag in (("train", "loss/eval_train"), ("val", "loss/val")):
        losses = torch.zeros(sequences // micro)
        for k in range(len(losses)):  # get_batch(split, it=0, microstep=k)
            ix = tables[name][0, k * micro : (k + 1) * micro].tolist()
            x = torch.stack([torch.from_numpy(splits[name][i : i + T].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(splits[name][i + 1 : i + 1 + T].astype(np.int64)) for i in ix])
            with torch.no_grad():
                losses[k] = theirs(x, y)[1].item()
        assert logged[tag][0] == pytest.approx(losses.mean().item(), rel=1e-6), tag
        assert logged[f"{tag}_std"][0] == pytest.approx(losses.std().item(), rel=1e-5), tag


# ---------------------------------------------------------------- 2b. sharded over two processes

SHARDED = {  # name -> (paper mode, ModelArgs overrides); odd widths give shards of unequal size
    "res_gelu_tied": ("residual_gelu", {}),
    "linear_untied_odd": ("original", {"dim": 36, "n_heads": 3, "vocab_size": 101, "n_layers": 3, "mlp_hidden": 100,
                                       "tie_embeddings": False}),
    "residual_tied": ("residual", {}),
}
SHARDED_SEED = 1337


def _sharded_worker(out: str) -> None:
    """Under torchrun (2 CPU processes, gloo): paper init through FSDP2's sharded init, gathered on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from torchnlq.config.job_config import ActivationCheckpoint, Float8, Parallelism, Training
    from torchnlq.parallel.dist import build_mesh, destroy_distributed, init_distributed
    from torchnlq.parallel.parallelize import materialize_and_init, parallelize_model

    info = init_distributed("cpu")
    results = {}
    for name, (mode, overrides) in SHARDED.items():
        shape = {"n_layers": L, "dim": D, "n_heads": H, "vocab_size": V, "max_seq_len": T, "mlp_hidden": HIDDEN,
                 **overrides}
        args = ModelArgs(**shape, query=Query(type=MODES[mode]), init="paper")
        mesh = build_mesh(info, Parallelism())
        with torch.device("meta"):
            model = build_model(args)
        parallelize_model(model, training=Training(), ac=ActivationCheckpoint(), float8=Float8(),
                          parallelism=Parallelism(), mesh=mesh, device=info.device)
        materialize_and_init(model, info.device, SHARDED_SEED, mesh)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if info.rank == 0:
            expected = paper_initial_weights(SHARDED_SEED, mode, args.n_layers, args.dim, args.vocab_size,
                                             args.max_seq_len, args.mlp_hidden, args.tie_embeddings)
            ours = as_paper_state_dict(full, args.n_layers)
            results[name] = {"keys": set(ours) == set(expected),
                             "different": [k for k in expected if not torch.equal(ours[k], expected[k])]}
    if info.rank == 0:
        Path(out).write_text(json.dumps({"world_size": info.world_size, **results}))
    destroy_distributed()


@pytest.mark.integration
def test_paper_init_sharded_over_two_processes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(REPO_ROOT / "tests"), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, str(out)]
    proc = subprocess.run(cmd, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(out.read_text())
    assert results.pop("world_size") == 2
    assert results == {name: {"keys": True, "different": []} for name in SHARDED}


# ---------------------------------------------------------------- 4. the schedule to the step

# The configs that are the paper's runs and the paper code's config each reproduces
# (configs/configs_tied/*.py, configs/configs_untied/*.py): max_iters, lr_decay_iters,
# learning_rate, min_lr, weight_decay. Its loop runs iterations 0..max_iters (it stops once
# iter_num > max_iters): max_iters + 1 updates.
PAPER_RUNS = {
    "gpt_small_baseline": ("config_tiedw_original", 60002, 60002, 6e-4, 6e-5, 0.1),
    "gpt_small_mlp4_75": ("config_tiedw_original_mlp_4_75_times", 60002, 60002, 6e-4, 6e-5, 0.1),
    "gpt_small_mlp4_75_lrscaled": ("config_tiedw_original_mlp_4_75_times_lrscaled", 60002, 60002,
                                   6e-4 / math.sqrt(1.125), 6e-5 / math.sqrt(1.125), 0.1),
    "gpt_small_res_gelu_lr2p6e-3": ("config_tiedw_residual_gelu_2-5wd_2_6e-3lr_3e-5", 60002, 60002, 2.6e-3, 3e-5,
                                    2**-5),
    "gpt_small_res_gelu": ("config_tiedw_residual_gelu_2-5wd_3e-3lr_3e-5", 60002, 60002, 3e-3, 3e-5, 2**-5),
    "gpt_small_residual": ("config_tiedw_residual", 60002, 60002, 6e-4, 6e-5, 0.1),
    "gpt_small_identity_paper": ("config_untiedw_identity", 105001, 600000, 6e-4, 6e-5, 2**-5),
}


def paper_lr(it: int, lr: float, min_lr: float, decay_iters: int, warmup: int = 2000) -> float:
    """The paper's get_lr(it): linear warmup to lr, cosine to min_lr at decay_iters, min_lr after."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    decay_ratio = (it - warmup) / (decay_iters - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (lr - min_lr)


@pytest.mark.parametrize("config", list(PAPER_RUNS))
def test_the_schedule_is_the_papers_to_the_step(config: str) -> None:
    from torchnlq.train.lr_schedule import lr_at

    _, max_iters, decay_iters, lr, min_lr, wd = PAPER_RUNS[config]
    cfg = load_job_config([str(REPO_ROOT / "train_configs" / f"{config}.toml")])
    assert cfg.training.steps == max_iters + 1
    assert (cfg.optimizer.lr, cfg.lr_schedule.min_lr, cfg.optimizer.weight_decay) == (lr, min_lr, wd)
    assert (cfg.lr_schedule.warmup_steps, cfg.training.seed, cfg.model.init) == (2000, 1337, "paper")
    assert check_job_config(cfg).tie_embeddings == (config != "gpt_small_identity_paper")
    # Step s (1-based) takes the LR of the paper's iteration s - 1: the same float at every step.
    steps = range(cfg.training.steps)
    ours = [lr_at(it, cfg.optimizer.lr, cfg.lr_schedule, cfg.training.steps) for it in steps]
    assert ours == [paper_lr(it, lr, min_lr, decay_iters) for it in steps]


def test_torchnlqs_own_identity_arm_is_the_baselines_configuration() -> None:
    base, identity = (load_job_config([str(REPO_ROOT / "train_configs" / f"{c}.toml")])
                      for c in ("gpt_small_baseline", "gpt_small_identity"))
    assert (identity.optimizer, identity.lr_schedule, identity.training) == (base.optimizer, base.lr_schedule,
                                                                             base.training)
    assert check_job_config(identity).tie_embeddings and "torchnlq's own arm" in (
        REPO_ROOT / "train_configs" / "gpt_small_identity.toml").read_text()
    assert num_params(check_job_config(identity), non_embedding=True) == 77_875_968


if __name__ == "__main__":
    _sharded_worker(sys.argv[1])
