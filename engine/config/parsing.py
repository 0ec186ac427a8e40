"""Plain data and YAML files to a validated RunConfig: each value coerced to its field's type, errors naming the
file, field and value."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from convalue.engine.config.fields import ConfigError, type_name
from convalue.engine.config.paths import resolve_relative
from convalue.engine.config.run import RunConfig


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """`value` as the field type `tp` (path: the field, for errors); sections are built and validated."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"must be one of {list(args)}", field=path, value=value)
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError("must be a list", field=path, value=value)
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not value:
            raise ConfigError("must be a non-empty mapping", field=path, value=value)
        return {_key(args[0], k, path): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError("must be true or false", field=path, value=value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("must be an integer", field=path, value=value)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError("must be a number", field=path, value=value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("must be a number", field=path, value=value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError("must be a string", field=path, value=value)
        return value
    raise TypeError(f"unsupported config type {type_name(tp)} at {path}")


def _key(tp: Any, key: Any, path: str) -> Any:
    """A mapping's key as its type: str, or int (a JSON round trip writes `1` as "1", so digits are read back)."""
    if tp is int and isinstance(key, str) and key.strip().lstrip("-").isdigit():
        key = int(key)
    if not isinstance(key, tp) or isinstance(key, bool):
        raise ConfigError(f"keys must be {type_name(tp)}s", field=f"{path}.{key}", value=key)
    return key


def _build(cls: type, data: Any, path: str) -> Any:
    """The section `cls` from a mapping, every field coerced, then validated (path: the section, for errors)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping", field=path or "<top level>", value=data)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown field; known fields are {sorted(names)}",
                          field=f"{path}.{unknown[0]}" if path else unknown[0], value=data[unknown[0]])
    kwargs = {}
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(hints[f.name], data[f.name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError("is required", field=sub)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as exc:
            if exc.field is not None and exc.file is None and not exc.field.startswith(path + ".") and path:
                raise ConfigError(exc.reason, field=f"{path}.{exc.field}", value=exc.value) from None
            raise
    return obj


def config_from_dict(data: Any, *, file: str | None = None, base: str | Path | None = None) -> RunConfig:
    """Validate plain data into a RunConfig; errors name the file, field and value.

    base: the folder relative paths are read against (load_config: the config file's); None: the current directory.
    """
    if base is not None:
        data = resolve_relative(data, Path(base))
    try:
        return _build(RunConfig, data, "")
    except ConfigError as exc:
        if file is None:
            raise
        raise ConfigError(exc.reason, file=file, field=exc.field, value=exc.value) from None


def apply_overrides(data: dict, overrides: list[str], file: str | None = None) -> dict:
    """A copy of a config's plain data with `key.path=value` overrides set (value read as YAML: 0.1, true, null,
    [1, 2], text); the path must name fields of the config's sections (checked when the data is validated), a list's
    item by its index (data.candidates.0.clusters=100)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigError("--set takes key.path=value, e.g. solver.gamma=0.1", file=file, value=item)
        try:
            value = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: the value is not YAML ({_yaml_problem(exc)})", file=file,
                              value=raw) from None
        except ConfigError as exc:  # a key given twice inside the value
            raise ConfigError(f"--set {key}: {exc.field} {exc.reason}", file=file, value=raw) from None
        node = data
        for i, part in enumerate(parts):
            if isinstance(node, list):  # a list's item by its index: data.candidates.0.clusters
                if not (part.isdigit() and int(part) < len(node)):
                    raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} has {len(node)} item(s), numbered from 0",
                                      file=file, value=item)
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} is not a section", file=file, value=item)
            if i == len(parts) - 1:
                node[part] = value
            else:
                if isinstance(node, dict) and node.get(part) is None:
                    node[part] = {}
                node = node[part]
    return data


def load_yaml(text: str) -> Any:
    """The plain data of a YAML document, as yaml.safe_load reads it, but a key given twice in one mapping is a
    ConfigError naming the key's path (field) and both lines: PyYAML would silently keep the last."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(loader, node, "", set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(loader: yaml.SafeLoader, node: yaml.Node, path: str, walked: set[int]) -> None:
    """Walk a composed YAML node: each mapping's keys must differ (`<<` merge keys aside, which YAML lets the
    mapping's own keys override); path is the node's key path, list items by index (as --set names them); walked:
    the nodes seen (an alias repeats a node, and may hold itself)."""
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(loader, item, f"{path}.{i}" if path else str(i), walked)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[Any, yaml.Node] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key_node, yaml.ScalarNode):  # a complex key (`? [a, b]`): no config field has one
            _refuse_duplicate_keys(loader, value_node, path, walked)
            continue
        key = loader.construct_object(key_node)
        sub = f"{path}.{key}" if path else str(key)
        if key in seen:
            a, b = seen[key].start_mark, key_node.start_mark
            where = f"lines {a.line + 1} and {b.line + 1}" if a.line != b.line else \
                f"line {a.line + 1}, columns {a.column + 1} and {b.column + 1}"
            raise ConfigError(f"is given twice in one mapping ({where}); YAML would keep only the last, so merge "
                              "the two into one", field=sub)
        seen[key] = key_node
        _refuse_duplicate_keys(loader, value_node, sub, walked)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what, and where (line and column, from 1)."""
    mark = getattr(exc, "problem_mark", None)
    what = "; ".join(str(x) for x in (getattr(exc, "context", None), getattr(exc, "problem", None)) if x)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{what or ' '.join(str(exc).split())}{where}"


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read and validate a YAML run config, with `key.path=value` overrides; its relative paths are read against its
    folder (see resolve_relative), an override's path value against the current directory."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config file not found", file=str(path))
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {_yaml_problem(exc)}", file=str(path)) from None
    except ConfigError as exc:  # a key given twice
        raise ConfigError(exc.reason, file=str(path), field=exc.field) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the file as UTF-8", file=str(path)) from None
    if data is None:
        raise ConfigError("config file is empty", file=str(path))
    if not overrides:
        return config_from_dict(data, file=str(path), base=path.parent)
    resolved = resolve_relative(data, path.parent)  # the file's own paths, absolute now
    return config_from_dict(apply_overrides(resolved, overrides, str(path)), file=str(path), base=Path.cwd())
