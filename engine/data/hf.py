"""Rows of a Hugging Face dataset (source kind `hf`, the `datasets` package): a hub id read from the local cache
(HF_HUB_OFFLINE) or the hub, a folder written by save_to_disk, or a local copy of a dataset repository."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from convalue.engine.config import SourceConfig
from convalue.engine.config.sources import HF_EXTRA
from convalue.engine.data.examples import DataError
from convalue.engine.model.hub import fetch_hint, hub_offline, hub_snapshot

log = logging.getLogger("convalue")
Rows = Iterator[tuple[str, dict]]


def _datasets() -> Any:
    try:
        # datasets: the optional `hf` extra, only for a Hugging Face source
        import datasets
    except ModuleNotFoundError:
        raise DataError(f"source kind `hf` needs the `datasets` package: {HF_EXTRA}") from None
    return datasets


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _from_disk(src: SourceConfig, folder: Path) -> tuple[Any, str]:
    """(dataset, label) of a folder written by save_to_disk: a Dataset, or one split of a DatasetDict."""
    datasets = _datasets()
    if src.name is not None:
        raise DataError(f"source {src.path!r}: `name` (a dataset configuration) does not apply to a folder written "
                        "by save_to_disk")
    try:
        ds = datasets.load_from_disk(str(folder))
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError or pyarrow errors for a bad folder
        raise DataError(f"{folder}: cannot be read by datasets.load_from_disk ({_reason(exc)})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = src.split or "train"
        if split not in ds:
            raise DataError(f"{folder}: no split {split!r} (it has {sorted(ds)}); set `split`")
        return ds[split], f"{folder}[{split}]"
    if src.split is not None:
        raise DataError(f"{folder}: holds a single Dataset, which has no splits; leave `split` null "
                        f"(got {src.split!r})")
    return ds, str(folder)


def _load(path: str, src: SourceConfig, **kwargs: Any) -> Any:
    """datasets.load_dataset of one split: streamed (no copy into the datasets cache) unless the split is sliced."""
    datasets = _datasets()
    split = src.split or "train"
    stream = kwargs.pop("stream", True) and "[" not in split
    return datasets.load_dataset(path, name=src.name, split=split, streaming=stream, **kwargs)


def _from_hub(src: SourceConfig) -> tuple[Any, str]:
    """(dataset, label) of a hub id: its snapshot in the Hugging Face cache when there is one (always offline),
    else load_dataset by id (online: downloaded once into the cache; offline: datasets' own cache)."""
    datasets = _datasets()
    revision = src.revision or "main"
    label = f"{src.path}@{revision}[{src.split or 'train'}]"
    offline = hub_offline() or bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))
    errors = []
    if offline:
        try:
            folder = hub_snapshot(src.path, revision, None, what="source", error=DataError, repo_type="dataset",
                                  local_only=True)
            ds = _load(str(folder), src)
            log.info("hf dataset %s: commit %s from the Hugging Face cache %s", label, folder.name, folder)
            return ds, label
        except Exception as exc:  # not in the hub cache, or its files do not make this config: try datasets' cache
            errors.append(_reason(exc))
    try:
        return _load(src.path, src, revision=src.revision, stream=False), label
    except Exception as exc:
        errors.append(_reason(exc))
    if offline:
        raise DataError(f"source {src.path!r} (revision {revision!r}, split {src.split or 'train'!r}): not in the "
                        f"local Hugging Face cache and HF_HUB_OFFLINE is set: "
                        f"{fetch_hint(src.path, revision, 'dataset')} ({'; '.join(errors)})")
    raise DataError(f"source {src.path!r} (revision {revision!r}): cannot be loaded ({'; '.join(errors)})")


def hf_rows(src: SourceConfig) -> Rows:
    """(where, row) of every row of an `hf` source's split, read one batch at a time."""
    path = Path(src.path).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            ds, label = _from_disk(src, path)
        else:  # a dataset repository's files (README configs, data files), as the hub would serve them
            try:
                ds, label = _load(str(path), src), f"{path}[{src.split or 'train'}]"
            except Exception as exc:
                raise DataError(f"{path}: cannot be read by datasets.load_dataset ({_reason(exc)})") from None
    else:
        ds, label = _from_hub(src)
    i = 0
    try:
        for row in ds:
            yield f"{label} row {i}", row
            i += 1
    except Exception as exc:  # a damaged data file found while reading
        raise DataError(f"{label} row {i}: cannot be read ({_reason(exc)})") from None
