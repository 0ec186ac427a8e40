"""The config reference: every section and field with its type, default and help, as Markdown."""

from __future__ import annotations

import dataclasses
import typing

from convalue.engine.config.fields import type_name
from convalue.engine.config.run import RunConfig


def reference_markdown() -> str:
    """The config reference (every section and field with type, default and help) as Markdown."""
    lines: list[str] = []
    seen: dict[type, str] = {}

    def section(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        if cls in seen:
            lines.append(f"### `{prefix}` — each item has the fields of `{seen[cls]}`.\n")
            return
        seen[cls] = prefix
        lines.append(f"### `{prefix or 'top level'}` — {cls.__doc__.strip()}\n")
        lines.append("| field | type | default | meaning |\n| --- | --- | --- | --- |")
        nested = []
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
            inner += [b for a in typing.get_args(tp) for b in typing.get_args(a) if dataclasses.is_dataclass(b)]
            if dataclasses.is_dataclass(tp) or inner:
                nested.append((tp if dataclasses.is_dataclass(tp) else inner[0], f"{prefix}.{f.name}".strip(".")))
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`" if f.default is not None else "—"
            elif f.default_factory is not dataclasses.MISSING and not dataclasses.is_dataclass(tp):
                default = f"`{f.default_factory()!r}`"
            else:
                default = "required" if f.default_factory is dataclasses.MISSING else "(section)"
            lines.append(f"| `{f.name}` | {type_name(tp)} | {default} | {f.metadata.get('help', '')} |")
        lines.append("")
        for cls2, p in nested:
            section(cls2, p)

    section(RunConfig, "")
    return "\n".join(lines)
