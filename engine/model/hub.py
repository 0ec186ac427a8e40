"""Hugging Face hub repositories as local folders: huggingface_hub's snapshot of a model or dataset repository, read
from its cache (HF_HUB_CACHE or HF_HOME) and, unless HF_HUB_OFFLINE is set, downloaded into it once."""

from __future__ import annotations

from pathlib import Path


def hub_offline() -> bool:
    """Whether huggingface_hub runs offline (HF_HUB_OFFLINE, read by the library when it is imported)."""
    # huggingface_hub (slow; reads HF_HUB_OFFLINE at import): only when the hub is asked
    from huggingface_hub import constants

    check = getattr(constants, "is_offline_mode", None)
    return bool(check()) if check is not None else bool(constants.HF_HUB_OFFLINE)


def hub_cache() -> str:
    """The folder huggingface_hub caches repositories in."""
    # huggingface_hub (slow to import): only when the hub cache is asked for
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def fetch_hint(repo_id: str, revision: str, repo_type: str = "model") -> str:
    """How to put a repository into the cache of an offline machine."""
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    return (f"fetch it on a machine with network access with `hf download {repo_id} --revision {revision}{kind}` "
            f"(huggingface_hub before 0.34: `huggingface-cli download ...`) and copy its cache folder here (set "
            "HF_HUB_CACHE or HF_HOME to point at it), or unset HF_HUB_OFFLINE to let convalue download it")


def hub_snapshot(repo_id: str, revision: str, patterns: list[str] | None, *, what: str,
                 error: type[Exception] = RuntimeError, repo_type: str = "model",
                 weights: tuple[str, ...] = (), local_only: bool = False) -> Path:
    """The local snapshot folder (named by its commit) of a hub repository at revision.

    patterns: the files to download (None: all); weights: names one of which the folder must hold, else `*.bin`
    weights are fetched too (a repository without safetensors); local_only: read the cache even when online.
    what: the config field, for errors; error: the exception type raised, with a message that says how to fetch it.
    """
    # huggingface_hub (slow to import): only when a snapshot is fetched
    from huggingface_hub import snapshot_download

    offline = local_only or hub_offline()
    where = f"{what} {repo_id!r} (revision {revision!r})"
    try:
        folder = Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, allow_patterns=patterns,
                                        local_files_only=offline))
        if weights and not any((folder / w).is_file() for w in weights) and not offline and patterns is not None:
            folder = Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision,
                                            allow_patterns=[*patterns, "*.bin"]))
    except Exception as exc:  # huggingface_hub's errors differ by version: not cached, incomplete, not found, HTTP
        reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        if offline:
            raise error(f"{where} is not (completely) in the Hugging Face cache {hub_cache()} and HF_HUB_OFFLINE is "
                        f"set: {fetch_hint(repo_id, revision, repo_type)} ({reason})") from None
        raise error(f"{where} cannot be fetched from the Hugging Face hub ({reason}); on a machine without network "
                    f"access, {fetch_hint(repo_id, revision, repo_type)}") from None
    return folder
