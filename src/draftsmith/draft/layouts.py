"""The names of the EAGLE-3 folder layouts that the engines read, in one place for the reader
(draft/importer.py) and the writers (export/eagle.py, export/speculators.py).

    config.json fields   eagle_aux_hidden_state_layer_ids (top level: vLLM's convention),
                         eagle_config.eagle_aux_hidden_state_layer_ids (the engine's own),
                         the architecture options under their config.json names,
                         draftsmith: {...}, draftsmith's record of the conventions
    weight names         the first decoder layer: midlayer.* (EAGLE reference, SGLang) or layers.0.*
                         (speculators); layers 1.. (`num_hidden_layers` > 1, vLLM): layers.{i}.* in
                         both; draftsmith's own names are midlayer.* and extra_layers.{i-1}.*

`check_vocab` is the check every folder passes on the way in and out: d2t and t2d describe
the same draft vocab. No file I/O in this module.
"""

from __future__ import annotations

import torch

from draftsmith.draft.model import DrafterConfig, LayerShape
from draftsmith.errors import UserError

RECORD_KEY = "draftsmith"  # the config.json entry that records conventions for the reload
TOP_LEVEL_IDS, NESTED_IDS = "eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"
ARCH_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")  # = the config.json names
LAYER_PREFIX, DRAFTSMITH_PREFIX = "layers.0.", "midlayer."  # speculators' first decoder layer's names, and ours
EXTRA_PREFIX = "extra_layers."  # draftsmith's layers 1..: extra_layers.{i-1}.* = the engines' layers.{i}.*


def to_engine_key(key: str, first_layer: str) -> str:
    """A draftsmith weight name -> the engines': midlayer.* -> `first_layer`* (midlayer. or layers.0.),
    extra_layers.{j}.* -> layers.{j+1}.*; every other name stays."""
    if key.startswith(DRAFTSMITH_PREFIX):
        return first_layer + key[len(DRAFTSMITH_PREFIX) :]
    if key.startswith(EXTRA_PREFIX):
        j, rest = key[len(EXTRA_PREFIX) :].split(".", 1)
        return f"layers.{int(j) + 1}.{rest}"
    return key


def to_draftsmith_key(key: str) -> str:
    """An engine's weight name (midlayer.*, layers.{i}.*, maybe under model.) -> draftsmith's."""
    name = key.removeprefix("model.")
    if name.startswith(LAYER_PREFIX):
        return DRAFTSMITH_PREFIX + name[len(LAYER_PREFIX) :]
    if name.startswith("layers."):
        i, rest = name[len("layers.") :].split(".", 1)
        return f"{EXTRA_PREFIX}{int(i) - 1}.{rest}"
    return name


def arch_options(cfg: DrafterConfig) -> dict[str, bool]:
    """The architecture options, under the config.json names both layouts write."""
    return {name: bool(getattr(cfg, name)) for name in ARCH_OPTIONS}


def check_vocab(cfg: LayerShape, d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    """d2t [draft_vocab] int offsets and t2d [vocab] bool must describe the same draft vocab."""
    if tuple(d2t.shape) != (cfg.draft_vocab_size,) or tuple(t2d.shape) != (cfg.vocab_size,):
        raise UserError(
            f"{where}: vocab size mismatch: d2t has {tuple(d2t.shape)} entries and t2d {tuple(t2d.shape)}, "
            f"but the config says draft_vocab_size={cfg.draft_vocab_size}, vocab_size={cfg.vocab_size}; "
            "the checkpoint and its config.json come from different runs"
        )
    target_ids = torch.arange(cfg.draft_vocab_size) + d2t.long()  # [draft_vocab]
    if target_ids.min() < 0 or target_ids.max() >= cfg.vocab_size:
        raise UserError(f"{where}: d2t maps draft ids outside the target vocab 0..{cfg.vocab_size - 1}")
    if not torch.equal(t2d.bool().nonzero().flatten(), target_ids.sort().values):
        raise UserError(f"{where}: d2t and t2d disagree on which target ids the draft vocab holds")
