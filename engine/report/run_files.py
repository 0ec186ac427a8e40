"""What a run folder holds, for report.html: each file read once and only when a section asks for it; a file that
cannot be used is None, with the reason in `problems`."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.files.folder import RunFolder
from convalue.engine.report.html_markup import Html, el, h, mapping, para
from convalue.engine.store.summary import RunSummary

PNG = b"\x89PNG\r\n\x1a\n"
#: the columns report.html reads from each table (a table without them is reported, not used)
COLUMNS = {
    "scores": ("group", "score", "beta", "cosine", "rank", "selected", "n_examples", "n_preview"),
    "bootstrap": ("group", "score_mean", "score_std", "score_q025", "score_q975", "p_positive", "p_selected"),
    "examples": ("group", "prompt", "response"),
    "clusters": ("group", "source_group", "prompt", "response"),
    "evaluation": ("method", "k", "seed", "label", "groups", "val_loss"),
}


@dataclass
class RunFiles:
    """What a run folder (local or on any pyarrow filesystem) holds, each file read once and only when a section
    asks; a file that cannot be used is None, with the reason in `problems`."""

    folder: RunFolder
    summary: RunSummary | None
    summary_problem: str | None = None
    problems: dict[str, str] = field(default_factory=dict)
    _tables: dict[tuple, pa.Table | None] = field(default_factory=dict)

    def config(self, name: str) -> dict:
        """The config echo's section `name` ({} where absent)."""
        return mapping(self.summary.config.get(name)) if self.summary and isinstance(self.summary.config, dict) else {}

    def field(self, name: str) -> Any:
        """summary.json's field `name` (None without a summary)."""
        return getattr(self.summary, name, None) if self.summary is not None else None

    def table(self, name: str, groups: list[str] | None = None) -> pa.Table | None:
        """<name>.parquet (only the rows of `groups` where given: a flat pool's clusters.parquet can be large)."""
        key = (name, None if groups is None else tuple(groups))
        if key not in self._tables:
            self._tables[key] = self._read(name, groups)
        return self._tables[key]

    def rows(self, name: str) -> list[dict] | None:
        """<name>.parquet's rows as dicts."""
        t = self.table(name)
        return None if t is None else t.to_pylist()

    def _read(self, name: str, groups: list[str] | None) -> pa.Table | None:
        file = f"{name}.parquet"
        try:
            if not self.folder.is_file(file):
                return None
            schema = pq.read_schema(self.folder.path(file), filesystem=self.folder.fs)
            missing = [c for c in COLUMNS.get(name, ()) if c not in schema.names]
            if missing:
                self.problems[file] = f"{file} lacks the column(s) {missing}: not used"
                return None
            return pq.read_table(self.folder.path(file), filesystem=self.folder.fs,
                                 filters=None if groups is None else [("group", "in", groups)])
        except (OSError, pa.ArrowException, ValueError) as exc:
            self.problems[file] = f"{file} cannot be read ({type(exc).__name__}: {exc}): not used"
            return None

    def image(self, name: str, alt: str) -> Html:
        """<img> of the PNG `name` as a data URI, or a sentence on why there is none."""
        try:
            if not self.folder.is_file(name):
                return para(f"{name} is not in the run folder.", class_="missing")
            data = self.folder.read_bytes(name)
        except OSError as exc:
            return para(f"{name} cannot be read ({exc}).", class_="missing")
        if not data.startswith(PNG):
            return para(f"{name} is not a PNG image: not shown.", class_="missing")
        return el("figure", Html(f'<img src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}" '
                                 f'alt="{h(alt)}">'), el("figcaption", name))
