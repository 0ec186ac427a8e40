"""Data sources → named groups of chat examples; target split and seeded previews."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

from convalue.engine.config import DataConfig, SourceConfig
from convalue.engine.config.sources import FILE_FORMATS, GZIP_FORMATS, data_file_stem, file_format
from convalue.engine.data.clustering import Embed, cluster_pool
from convalue.engine.data.examples import ROLES, DataError, Example, Group
from convalue.engine.data.files import read_rows
from convalue.engine.data.hf import hf_rows

log = logging.getLogger("convalue")
#: the names of files a folder source reads
FILE_NAMES = [f"*{s}" for s in FILE_FORMATS] + [f"*.{f}.gz" for f in GZIP_FORMATS]


def _pair(prompt: object, response: object, where: str) -> Example:
    for field_name, value in (("prompt", prompt), ("response", response)):
        if not isinstance(value, str):
            raise DataError(f"{where}: field {field_name!r} must be a string, got {type(value).__name__} {value!r}")
    return Example((("user", prompt), ("assistant", response)))


def _messages(value: object, where: str) -> Example:
    if isinstance(value, str):  # a CSV cell, or a column that stores the list as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: `messages` is text but not JSON ({exc.msg})") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: `messages` must be a non-empty list of {{role, content}}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"{where}: messages[{i}] must have `role` and `content`, got {m!r}")
        if m["role"] not in ROLES:
            raise DataError(f"{where}: messages[{i}].role must be one of {list(ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise DataError(f"{where}: messages[{i}].content must be a string, got {m['content']!r}")
        out.append((m["role"], m["content"]))
    if not any(r == "assistant" for r, _ in out):
        raise DataError(f"{where}: `messages` has no assistant turn, so there is no response to learn")
    return Example(tuple(out))


def _row_example(row: dict, src: SourceConfig, where: str) -> Example:
    if src.messages_field in row and row[src.messages_field] is not None:
        return _messages(row[src.messages_field], where)
    missing = [f for f in (src.prompt_field, src.response_field) if f not in row or row[f] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing}; expected `{src.prompt_field}` and "
                        f"`{src.response_field}`, or `{src.messages_field}` (row has {sorted(row)})")
    return _pair(row[src.prompt_field], row[src.response_field], where)


def _groups_from_rows(rows: Iterator[tuple[str, dict]], src: SourceConfig, default_name: str,
                      origin: str) -> dict[str, Group]:
    """The groups of a stream of rows: by the group_by column, else one group named default_name."""
    groups: dict[str, Group] = {}
    for where, row in rows:
        if src.group_by:
            if src.group_by not in row or row[src.group_by] in (None, ""):
                raise DataError(f"{where}: missing group column {src.group_by!r}")
            name = str(row[src.group_by])
        else:
            name = default_name
        groups.setdefault(name, Group(name, [], origin))
        groups[name].examples.append(_row_example(row, src, where))
    return groups


def _load_folder(src: SourceConfig) -> dict[str, Group]:
    """One group per data file of the folder, named after the file; other files are listed in a warning."""
    folder = Path(src.path).expanduser()
    entries = sorted(folder.iterdir())
    readable = [p for p in entries if p.is_file() and _group_file(p)]
    if not readable:
        raise DataError(f"{folder}: folder source has no data files ({', '.join(FILE_NAMES)})")
    ignored = [p.name for p in entries if p not in readable and not p.name.startswith(".")]
    if ignored:  # e.g. data.JSONL or data.txt: a group the user meant to include would vanish unseen
        log.warning("%s: not read (only %s files are groups): %s", folder, ", ".join(FILE_NAMES),
                    ", ".join(ignored[:10]))
    groups: dict[str, Group] = {}
    for p in readable:
        name = data_file_stem(p)
        if name in groups:
            raise DataError(f"{folder}: two files make the group {name!r} (duplicate group name)")
        groups[name] = Group(name, [_row_example(r, src, w) for w, r in read_rows(p)], str(p))
    return groups


def _group_file(path: Path) -> bool:
    fmt, gz = file_format(path)
    return fmt is not None and (not gz or fmt in GZIP_FORMATS)


def source_label(src: SourceConfig) -> str:
    """A source's own name: a file's name without its suffixes, a folder's or hub dataset's name, else its kind."""
    if not src.path:
        return src.kind
    if src.kind in ("folder", "hf"):
        return Path(src.path.rstrip("/")).name
    return data_file_stem(src.path)


#: libyaml's safe loader where PyYAML was built with it (10x faster on the corpus's 237 files; the same data)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def chatterbot_root() -> Path:
    """The data folder of the installed chatterbot-corpus package."""
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("source kind `chatterbot` needs `pip install --no-deps chatterbot-corpus==1.3.3 pyyaml`")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _load_chatterbot(src: SourceConfig) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for f in sorted(chatterbot_root().glob("*/*.yml")):
        name = f.parent.name if src.group_by in (None, "language") else f"{f.parent.name}/{f.stem}"
        convs = (yaml.load(f.read_text("utf-8"), Loader=SAFE_LOADER) or {}).get("conversations") or []
        group = groups.setdefault(name, Group(name, [], f"chatterbot:{f.parent.name}"))
        for conv in convs:
            if not isinstance(conv, list):
                continue
            turns = [str(u) for u in conv]
            # consecutive turns make prompt -> response pairs
            group.examples.extend(Example((("user", a), ("assistant", b))) for a, b in zip(turns, turns[1:]))
    return groups


def _load_mathematics(src: SourceConfig) -> dict[str, Group]:
    if importlib.util.find_spec("mathematics_dataset") is None:
        raise DataError("source kind `mathematics` needs `pip install 'convalue[demo]'` (mathematics-dataset; make installs it)")
    # sympy's output depends on Python's string-hash seed; a child with a fixed seed makes the data reproducible
    request = {"include": src.include, "n": src.examples_per_group, "seed": src.seed}
    proc = subprocess.run([sys.executable, "-m", "convalue.engine.data.mathgen", json.dumps(request)], capture_output=True,
                          text=True, env=os.environ | {"PYTHONHASHSEED": "0"}, check=False)
    try:
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise DataError(f"source `mathematics`: the generator failed: {proc.stderr.strip()[-800:]}") from None
    if "error" in reply:
        raise DataError(f"source `mathematics`: {reply['error']}")
    if reply["broken"]:
        log.warning("mathematics: %d module(s) do not run with this numpy/sympy and are "
                                              "left out: %s", len(reply["broken"]), ", ".join(reply["broken"]))
    return {name: Group(name, [Example((("user", q), ("assistant", a))) for q, a in pairs], f"mathematics:{name}")
            for name, pairs in reply["groups"].items()}


def load_source(src: SourceConfig, *, embed: Embed | None = None) -> dict[str, Group]:
    """All groups of one source after include/exclude, each non-empty; with `clusters`, its k clusters instead.

    embed: how a flat pool's texts are embedded (default: in this process).
    """
    if src.kind == "chatterbot":
        groups = _load_chatterbot(src)
    elif src.kind == "mathematics":
        groups = _load_mathematics(src)
    elif src.kind == "folder":
        groups = _load_folder(src)
    elif src.kind == "hf":
        groups = _groups_from_rows(hf_rows(src), src, source_label(src), f"hf:{src.path}")
    else:
        path = Path(src.path).expanduser()
        groups = _groups_from_rows(read_rows(path, src.kind), src, source_label(src), str(path))
    label = src.path or src.kind
    if src.include is not None:
        unknown = sorted(set(src.include) - set(groups))
        if unknown:
            raise DataError(f"source {label!r}: include names unknown group(s) {unknown}; it has {sorted(groups)[:30]}")
        groups = {k: v for k, v in groups.items() if k in set(src.include)}
    unknown = sorted(set(src.exclude) - set(groups))
    if unknown and src.include is None:
        raise DataError(f"source {label!r}: exclude names unknown group(s) {unknown}")
    groups = {k: v for k, v in groups.items() if k not in set(src.exclude)}
    for g in groups.values():
        if not g.examples:
            raise DataError(f"source {label!r}: group {g.name!r} ({g.origin}) is empty")
    if src.clusters is not None:
        prefix = source_label(src)
        groups = cluster_pool(groups, src.clusters, src.embedding, src.seed, prefix, embed)
    return groups


def resolve_groups(cfg: DataConfig, *, embed: Embed | None = None) -> tuple[Group, list[Group]]:
    """The target group and the candidate groups (unique names, target not among them); embed: see load_source."""
    target_groups = load_source(cfg.target)
    origin = f" ({cfg.target.path})" if cfg.target.path else ""
    if not target_groups:
        raise DataError(f"data.target{origin}: no examples, so no target group")
    if len(target_groups) != 1:
        raise DataError(f"data.target{origin} must resolve to exactly one group, got {len(target_groups)}: "
                        f"{sorted(target_groups)[:10]} (use `include: [NAME]`)")
    target = next(iter(target_groups.values()))
    candidates: dict[str, Group] = {}
    for i, src in enumerate(cfg.candidates):
        for name, g in load_source(src, embed=embed).items():
            if name in candidates:
                raise DataError(f"data.candidates[{i}]: duplicate group name {name!r} "
                                f"(also from {candidates[name].origin})")
            candidates[name] = g
    if target.name in candidates:
        raise DataError(f"data.candidates: group {target.name!r} is also the target; exclude it from the candidates")
    if not candidates:
        files = [src.path for src in cfg.candidates if src.path]
        raise DataError("data.candidates resolved to no groups" + (f" (no examples in {files})" if files else ""))
    return target, list(candidates.values())


def _rng(seed: int, name: str, salt: str) -> np.random.Generator:
    # keyed by the group's name, so a group's sample does not change when other groups are added
    return np.random.default_rng([seed, zlib.crc32(name.encode()), zlib.crc32(salt.encode())])


def split_target(group: Group, val_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded (train, validation) split of the target; validation is never used for scoring."""
    n = len(group.examples)
    n_val = int(round(n * val_fraction))
    if n_val < 1 or n - n_val < 1:
        raise DataError(f"target group {group.name!r} has {n} examples: too few for a train/validation split "
                        f"with val_fraction={val_fraction}")
    order = _rng(seed, group.name, "split").permutation(n)
    val = [group.examples[i] for i in sorted(order[:n_val])]
    train = [group.examples[i] for i in sorted(order[n_val:])]
    return train, val


def sample_order(n: int, seed: int, name: str) -> np.ndarray:
    """Seeded order in which a group's examples enter its preview."""
    return _rng(seed, name, "preview").permutation(n)


def preview_indices(n: int, m: int, seed: int, name: str) -> np.ndarray:
    """Seeded choice of min(m, n) example indices of a group (its preview)."""
    return np.sort(sample_order(n, seed, name)[: min(m, n)])
