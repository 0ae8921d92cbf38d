"""What a family says about a standard Hugging Face architecture: its config.json keys and weight names, both ways.

Pure mappings between ModelArgs / a state dict and a config dict / Hugging Face tensor names, with no files and
no transformers: torchnlq.interop reads and writes the folders (safetensors, config.json, tokenizer files) and
asks the families' :class:`HFArchitecture` s for the rest (torchtitan's state-dict adapter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from .args import ModelArgs

#: ``take(name, shape)``: the fp32 tensor ``name`` of a Hugging Face folder, checked to have ``shape`` (the reader
#: raises one line naming the tensor otherwise).
Take = Callable[[str, tuple[int, ...]], torch.Tensor]


@dataclass(frozen=True)
class HFArchitecture:
    """A transformers architecture that computes some models of a family exactly (``--format <format>``)."""

    #: The export format's name (``hf-llama``) and transformers' class and ``model_type``.
    format: str
    architecture: str
    model_type: str
    #: Why this architecture cannot compute a model of these args (one line with what to do instead), or None.
    incompatibility: Callable[[ModelArgs], str | None]
    #: The config.json keys that describe the model (the ids, dtype and architecture are added by the writer).
    config: Callable[[ModelArgs], dict[str, Any]]
    #: The model's weights under the architecture's names, fp32.
    state_dict: Callable[[nn.Module], dict[str, torch.Tensor]]
    #: A config.json (parsed JSON) -> ModelArgs: ConfigError/UserError for a wrong type or size or what torchnlq
    #: cannot compute exactly, KeyError for a missing key (the reader words it).
    model_args: Callable[[dict[str, Any]], ModelArgs]
    #: The folder's weights (``take``) -> the torchnlq state dict of ``args``, fp32.
    read_state_dict: Callable[[ModelArgs, Take], dict[str, torch.Tensor]]
    #: A prefix the weight names may carry or not (GPT-2: ``transformer.`` in GPT2LMHeadModel, none in GPT2Model).
    prefix: str = ""
