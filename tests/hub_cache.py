"""A real Hugging Face hub cache on disk, laid out as huggingface_hub writes it: blobs, snapshots of symlinks, refs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def hub_repo(cache: Path, repo_id: str, snapshots: dict[str, Path], refs: dict[str, str],
             repo_type: str = "model") -> Path:
    """Put repo_id into the cache folder: each commit's snapshot holds the files of a local folder (as symlinks to
    content-addressed blobs), and refs name commits (`main` -> a commit); returns the repository's cache folder."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    for commit, folder in snapshots.items():
        assert len(commit) == 40, "a commit hash has 40 hex digits"
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = f.read_bytes()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                blob.write_bytes(data)
            link = repo / "snapshots" / commit / f.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (repo / "refs" / ref).write_text(commit)
    return repo
