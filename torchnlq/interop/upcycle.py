"""Start from a pretrained model (a Hugging Face folder a family reads, read by
:func:`~torchnlq.interop.hf_folder.read_hf_model`, or a torchnlq checkpoint or export) and give a linear-query model
the anchored query (:func:`upcycle`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from torchnlq.config.job_config import Query
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE
from torchnlq.errors import UserError
from torchnlq.interop.hf_folder import hf_model_type, read_hf_model, readable_folders
from torchnlq.interop.load import LoadedModel, imported_meta, is_export, load_model, planned_model
from torchnlq.models.args import ModelArgs
from torchnlq.models.family import build_model
from torchnlq.models.query import QUERY_TYPES, QueryProjection, get_query_class


def check_carries_tokenizer(loaded: LoadedModel) -> None:
    """An imported model must bring a tokenizer into its export (generate.py has no other): else one line saying
    what to add to the source."""
    if not loaded.tokenizer.get("name"):
        raise UserError(
            f"'{loaded.path}' carries no tokenizer (no tokenizer.json or vocab.json) and its vocabulary "
            f"({loaded.args.vocab_size:,} ids) is not GPT-2's ({BASE_VOCAB_SIZE['gpt2']:,}), so --tiktoken-file "
            f"cannot supply one; save the model's tokenizer into it (tokenizer.save_pretrained('{loaded.path}'))"
        )


def pretrained_weights(source: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, fp32 state dict) of a Hugging Face folder a family reads or a torchnlq export/checkpoint; a
    Hugging Face folder's tensors are read without building a model (an initial load needs only them)."""
    path = _folder(source)
    if hf_model_type(path) is not None and not is_export(path):
        args, sd, _ = read_hf_model(path)
        return args, sd
    loaded = load_model(path, "cpu")
    return loaded.args, {k: v.float() for k, v in loaded.model.state_dict().items()}


def _folder(source: str | Path) -> Path:
    path = Path(source)
    if not path.is_dir():
        raise UserError(f"'{source}' does not exist or is not a folder; pass {readable_folders()} "
                        "or a torchnlq checkpoint or export")
    return path


def anchored_from_linear(source: ModelArgs, target: ModelArgs) -> bool:
    """True when ``target``'s query type starts from ``source``'s when upcycled (the query contract's
    ``upcycles_from``: anchored from linear), so that loading keeps the source's weights and draws the rest."""
    return source.query.type in get_query_class(target.query.type).upcycles_from


def query_tensors(args: ModelArgs) -> set[str]:
    """The state-dict keys of the query modules (every :class:`QueryProjection`) of a model of ``args``."""
    with torch.device("meta"):
        model = build_model(args)
    prefixes = tuple(f"{name}." for name, module in model.named_modules() if isinstance(module, QueryProjection))
    return {key for key in model.state_dict() if key.startswith(prefixes)}


@dataclasses.dataclass(frozen=True)
class InitialWeights:
    """What an initial load of a pretrained model gives a run (:func:`weights_for`)."""

    source: ModelArgs  #: the pretrained model
    fits: ModelArgs  #: the run's model with the source's query: what must equal ``source`` for the load
    state: dict[str, torch.Tensor]  #: the tensors to load (a replaced query's left out)
    note: str  #: for the log: "" when every tensor of the run comes from the source


def weights_for(source: str | Path, run: ModelArgs) -> InitialWeights:
    """What an initial load of the pretrained model at ``source`` gives a run of model ``run``.

    The same query type: every tensor, as saved. Anchored on a linear source: every tensor (its W_Q anchors the
    new query, f is drawn). Any other query type: the source's query tensors are left out and the run's queries
    start from their own init, so that a pretrained model can be continued with a nonlinear query (the paper's
    Q(X) = (X + f(X))/2 needs no W_Q); everything else must still be the source's shape.
    """
    source_args, state = pretrained_weights(source)
    if source_args.query.type == run.query.type:
        return InitialWeights(source_args, run, state, "")
    fits = dataclasses.replace(run, query=source_args.query)  # the shapes to compare, but for the query
    if anchored_from_linear(source_args, run):
        return InitialWeights(source_args, fits, state, "upcycled: its W_Q anchors this run's queries, f starts at "
                              "zero")
    dropped = query_tensors(source_args)
    kept = {key: value for key, value in state.items() if key not in dropped}
    return InitialWeights(source_args, fits, kept, replaced_query_note(source_args, run))


def replaced_query_note(source: ModelArgs, run: ModelArgs) -> str:
    """The start line's note for a run whose query type replaces the source's (every other tensor loaded)."""
    count = len(query_tensors(source))
    return (f"its {source.query.type} query ({count} tensor{'s' if count != 1 else ''}) is left out: this run's "
            f"{run.query.type} queries start from their init, every other tensor is the source's")


def _target(source: str | Path, args: ModelArgs, query: Query | None) -> ModelArgs:
    """The upcycled model's args: ``args`` with ``query`` (None, or the source's own type: as pretrained)."""
    if query is None or query.type == args.query.type:
        return args
    takers = [name for name, cls in QUERY_TYPES.items() if args.query.type in cls.upcycles_from]
    if query.type not in takers:
        why = (f"only {', '.join(map(repr, takers))} can" if takers else
               "no query type starts from it (a type's upcycles_from names the types it starts from)")
        raise UserError(f"'{source}' has a {args.query.type!r} query and {query.type!r} cannot start from it: {why}; "
                        "upcycling gives a pretrained linear W_Q (GPT-2's, Llama's, Qwen3's) the anchored query")
    target = dataclasses.replace(args, query=query)
    target.validate()
    return target


def _check_fits(source: str | Path, sd: dict[str, torch.Tensor], target: ModelArgs) -> None:
    """One line when the pretrained tensors ``sd`` are not the upcycled model's, less its new query branch."""
    shapes = {k: tuple(v.shape) for k, v in planned_model(target, torch.device("cpu"), source).state_dict().items()}
    # Only the queries may gain parameters (their new branch, drawn); every other tensor comes from the source.
    stray = [k for k in shapes if k not in sd and ".attn.query." not in k]
    unexpected = [k for k in sd if k not in shapes]
    if unexpected or stray:
        raise UserError(f"'{source}' does not fit the upcycled model (missing {stray[:3]}, unexpected "
                        f"{unexpected[:3]}); is it a linear-query model?")
    wrong = [k for k, v in sd.items() if tuple(v.shape) != shapes[k]]
    if wrong:
        raise UserError(f"'{source}': tensor '{wrong[0]}' has shape {tuple(sd[wrong[0]].shape)} but the upcycled "
                        f"model needs {shapes[wrong[0]]}; is it a linear-query model?")


def upcycle(source: str | Path, query: Query | None = None, seed: int = 0) -> LoadedModel:
    """The pretrained model at ``source`` with the query ``query`` (None: as pretrained), as a LoadedModel.

    ``anchored`` keeps a linear source's W_Q as the anchor and draws f with ``seed`` (f = 0 at the
    start): the result's logits equal the source's. It keeps the source's folder and kind, so that its export
    carries the source's tokenizer files (a Hugging Face tokenizer.json with its special tokens and chat
    template, a checkpoint's ranks); its metadata is the source's name only (a new model at step 0).
    """
    path = _folder(source)
    loaded = load_model(path, "cpu")
    target = _target(source, loaded.args, query)
    meta = imported_meta(path) if "imported_from" in loaded.meta else {"source": str(path)}
    if target is loaded.args:
        return LoadedModel(loaded.model, target, loaded.tokenizer, meta, loaded.path, loaded.kind)
    sd = {k: v.float() for k, v in loaded.model.state_dict().items()}
    _check_fits(source, sd, target)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = build_model(target)  # sized above: its weights fit this machine
    model.load_state_dict(sd, strict=False)
    model.eval()
    return LoadedModel(model, target, loaded.tokenizer, meta, loaded.path, loaded.kind)
