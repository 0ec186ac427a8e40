"""The content hash of a model folder (weights, config, tokenizer), cached by file size and mtime so a large model
is hashed again only when a file of it changes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from convalue.engine.files.locks import exclusive

#: a model folder's files that decide its vectors and fine-tunes: weights, configs, tokenizer, chat template
PATTERNS = ("*.safetensors", "*.bin", "*.index.json", "config.json", "generation_config.json", "tokenizer*",
            "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "chat_template*", "added_tokens.json")


def model_files(model_dir: Path) -> list[Path]:
    """The files of model_dir that its digest covers, sorted by name."""
    found = {p for pattern in PATTERNS for p in Path(model_dir).glob(pattern) if p.is_file()}
    return sorted(found, key=lambda p: p.name)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def model_digest(model_dir: Path, cache_dir: Path) -> str:
    """sha256 over the names and contents of model_dir's files; each file's hash is kept in cache_dir keyed by its
    path, size and mtime, and recomputed when one of them changes."""
    model_dir = Path(model_dir).resolve()
    files = model_files(model_dir)
    cache_dir = Path(cache_dir).expanduser()
    cache_file = cache_dir / f"digest-{hashlib.sha256(str(model_dir).encode()).hexdigest()[:16]}.json"
    with exclusive(cache_file.with_suffix(".lock")):
        try:
            cached = json.loads(cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cached = {}
        entries, outer = {}, hashlib.sha256()
        for path in files:
            st = path.stat()
            stamp = [st.st_size, st.st_mtime_ns]
            old = cached.get(path.name)
            digest = old["sha256"] if isinstance(old, dict) and old.get("stamp") == stamp else _file_sha256(path)
            entries[path.name] = {"stamp": stamp, "sha256": digest}
            outer.update(f"{path.name}\0{digest}\n".encode())
        if entries != cached:
            tmp = cache_file.with_name(cache_file.name + ".tmp")
            tmp.write_text(json.dumps(entries, sort_keys=True), encoding="utf-8")
            os.replace(tmp, cache_file)
    return outer.hexdigest()
