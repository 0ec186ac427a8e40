"""report.html from run folders built by hand (real Parquet tables, real PNGs, summary.json written through
RunSummary): the page parses, holds the expected tables and images, escapes the run's text, and says what is
missing or failed instead of failing itself. CPU only, no Ray, no model."""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convalue.engine.files.errors import StoreError
from convalue.engine.protocol.evaluate import summarise
from convalue.engine.report.html import render_report, write_report
from convalue.engine.report.html_sections import RANKING_NEGATIVE, RANKING_TOP, TARGET_KEY
from convalue.engine.report.tables import evaluation_table, scores_table
from convalue.engine.selection.bootstrap import outputs as bootstrap_outputs
from convalue.engine.selection.select import select_top_k
from convalue.engine.store.summary import RunSummary, SolverRecord

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "wbr"}
#: blocks a browser would not nest in a <p> (it closes the paragraph first, so the page it shows would differ)
BLOCKS = {"div", "p", "ul", "ol", "table", "pre", "section", "nav", "figure", "details", "h1", "h2", "h3"}
EVIL = "<script>alert('x')</script>"


class Doc(HTMLParser):
    """A parsed page: its tags, its text, each table's body rows (classes, cell texts); refuses unbalanced tags
    and blocks inside paragraphs (both would make a browser's page differ from the one written)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.chunks: list[str] = []
        self.rows: dict[str, list[tuple[str, list[str]]]] = {}
        self.headers: dict[str, list[str]] = {}
        self.open: list[str] = []
        self._table: str | None = None
        self._row: tuple[str, list[str]] | None = None
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()
        assert not self.open, f"unclosed tags: {self.open}"

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        assert not (tag in BLOCKS and "p" in self.open), f"<{tag}> inside a <p>"
        self.tags.append((tag, a))
        if tag not in VOID:
            self.open.append(tag)
        if tag == "table":
            self._table = a.get("id", f"table{len(self.rows)}")
            self.rows[self._table], self.headers[self._table] = [], []
        elif tag == "tr" and "tbody" in self.open:
            self._row = (a.get("class", ""), [])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            if self._row is not None:
                self._row[1].append(text)
            elif "thead" in self.open:
                self.headers[self._table].append(text)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows[self._table].append(self._row)
            self._row = None

    def handle_data(self, data):
        if "style" not in self.open and "title" not in self.open:
            self.chunks.append(data)
        if self._cell is not None:
            self._cell.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self.chunks).split())

    def all(self, tag: str) -> list[dict]:
        return [a for t, a in self.tags if t == tag]

    def candidates(self) -> list[list[str]]:
        return [cells for cls, cells in self.rows["ranking-table"] if "cand" in cls.split()]


def _png(path: Path, values) -> None:
    """A small valid PNG (a grey strip, one pixel per value) written by hand: no plotting library needed."""
    grey = bytes(int(255 * (i % 2)) for i, _ in enumerate(values)) or b"\x00"
    raw = b"\x00" + grey  # one scanline, filter type 0

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", len(grey), 1, 8, 0, 0, 0, 0)  # width x 1, 8-bit greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
                     + chunk(b"IEND", b""))


def _solver(**info) -> SolverRecord:
    return SolverRecord(form="penalised", gamma=0.01, budget=None, method="active_set", status="optimal",
                        objective=-0.0237, kkt=6.4e-17, iterations=7, time_s=0.0123, nnz=3, l1=0.36,
                        normalize="cosine", rank_bound=512, info=info)


def _eval_rows(names: list[str], ks: list[int], seeds: list[int]) -> list[dict]:
    """The protocol's fine-tune rows (as summary.json's `finetune` lists them) for kmm, alignment, random and
    target only: KMM a little better than the others."""
    rng = np.random.default_rng(3)
    rows = []
    for s in seeds:
        for m, offset in (("kmm", 0.0), ("alignment", 0.02), ("random", 0.05)):
            for k in ks:
                rows.append({"method": m, "k": k, "seed": s, "label": f"target + {m} top-{k}", "groups": names[:k],
                             "weights": None, "val_loss": 2.9 + offset + 0.01 * k + 0.003 * rng.standard_normal(),
                             "rho": 0.5, "target_steps": 12, "aux_steps": 12, "reused": False, "steps": 24,
                             "base_val_loss": 3.4})
        rows.append({"method": "target_only", "k": None, "seed": s, "label": "target only", "groups": [],
                     "weights": None, "val_loss": 2.95 + 0.003 * rng.standard_normal(), "rho": 1.0,
                     "target_steps": 24, "aux_steps": 0, "reused": False, "steps": 24, "base_val_loss": 3.4})
    return rows


def make_run(root: Path, names: list[str], *, k: int = 2, bootstrap: bool = True, finetune: bool = True,
             examples: bool = True, seed: int = 0, **summary_fields) -> Path:
    """A finished run folder with every file a run writes (those switched off left out)."""
    run = root / "run"
    run.mkdir()
    rng = np.random.default_rng(seed)
    n = len(names)
    w = rng.normal(size=n) * (rng.random(n) > 0.2)  # some exact zeros
    beta, cos = rng.normal(size=n), rng.uniform(-1, 1, size=n)
    selected = select_top_k(w, beta, k)
    scores = scores_table(names, [40] * n, [8] * n, w, beta, cos, selected)
    pq.write_table(scores, run / "scores.parquet")
    _png(run / "scores.png", w)
    fields = {"bootstrap": None, "evaluation": None, "finetune": None}
    if bootstrap:
        W = w + 0.1 * rng.normal(size=(20, n))
        S = np.zeros((20, n), dtype=bool)
        S[:, selected] = rng.random((20, len(selected))) > 0.3
        table, fields["bootstrap"] = bootstrap_outputs(names, w, beta, selected, W, S, 0)
        pq.write_table(table, run / "bootstrap.parquet")
    if examples:
        groups = [TARGET_KEY] + names
        pq.write_table(pa.table({"group": [g for g in groups for _ in range(3)],
                                 "prompt": [f"{g} prompt {i} <b>&</b>" for g in groups for i in range(3)],
                                 "response": [f"{g} response {i}" for g in groups for i in range(3)]}),
                       run / "examples.parquet")
    if finetune:
        rows = _eval_rows([names[i] for i in selected] or names[:2], [1, 2], [0, 1, 2])
        fields["evaluation"] = summarise(rows, [1, 2]) | {"fine_tunes": {"trained": len(rows), "reused": 0}}
        fields["finetune"] = rows
        pq.write_table(evaluation_table(rows), run / "evaluation.parquet")
        _png(run / "evaluation.png", [r["val_loss"] for r in rows])
    summary = RunSummary(
        status="complete",
        config={"name": "demo", "solver": {"gamma": 0.01, "budget": None, "method": "auto", "normalize": "cosine"},
                "select": {"k": k}, "features": {"representation": "one_step", "parameters": "lora",
                                                 "metric": "euclidean"},
                "projection": {"kind": "countsketch", "dim": 512}, "finetune": {"enabled": finetune},
                "bootstrap": {"samples": 20 if bootstrap else 0},
                "data": {"candidates": [{"kind": "jsonl", "path": "pool.jsonl", "group_by": "lang"}]}},
        packages={"convalue": "0.1.0", "torch": "2.4.0", "cvxpy": None},
        model={"source": "HuggingFaceTB/SmolLM2-135M-Instruct", "digest": "ab" * 32},
        data={"target": "marathi", "target_train": 80, "target_val": 20, "target_preview": 8, "candidates": n,
              "warnings": ["group 'x<y>': 2 example(s) without response tokens: skipped"]},
        featurize={"tokens": 123456, "tokens_per_second": 3592.4, "groups_computed": n + 1, "groups_reused": 0,
                   "workers": 2, "dim_in": 768, "dim_out": 512, "wall_seconds": 34.4},
        order=list(names), space="gram", solver=_solver(fallback=None, multiplier=0.01),
        selected=[names[i] for i in selected], timings_s={"model": 1.0, "featurize": 30.0, "solve": 2.0,
                                                           "finetune": 60.0, "total": 93.0},
        progress={"featurize": {"done": n + 1, "total": n + 1, "seconds": 30.0}},
        recovered={"featurize": {"retries": 1, "retried": ["hindi"], "worker_restarts": 1}}, **fields)
    for name, value in summary_fields.items():
        setattr(summary, name, value)
    summary.write(run)
    return run


LANGS = ["hindi", "urdu", "german", "spanish", "italian", "hebrew", "english"]


def test_a_complete_run_gives_every_section_with_its_tables_and_images(tmp_path):
    run = make_run(tmp_path, LANGS)
    path = write_report(run)
    assert path == run / "report.html" and path.read_text(encoding="utf-8") == render_report(run)
    doc = Doc(path.read_text(encoding="utf-8"))
    assert {a.get("id") for a in doc.all("section")} == {"question", "ranking", "selection", "evaluation",
                                                          "certificate", "cost", "provenance"}
    # self-contained: no script, no stylesheet or font link, every image inline
    assert not doc.all("script") and not doc.all("link")
    images = doc.all("img")
    assert len(images) == 2 and all(a["src"].startswith("data:image/png;base64,") for a in images)
    assert not [a for _, a in doc.tags for v in a.values() if v.startswith(("http:", "https:", "//"))]
    # the ranking: one row per candidate, rank order, with the bootstrap's confidence
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    cand = doc.candidates()
    assert [(c[0], c[1]) for c in cand] == [(str(r["rank"]), r["group"]) for r in scores]
    assert "95% interval" in doc.headers["ranking-table"] and "p(selected)" in doc.headers["ranking-table"]
    assert sum("sel" in cls.split() for cls, _ in doc.rows["ranking-table"]) == 2
    assert "positive, the group helps" in doc.text and "zero, it adds nothing the others" in doc.text
    assert "Bootstrap over the previews (20 resamples)" in doc.text
    # the selection: examples of each selected group and of the target, escaped
    summary = RunSummary.read(run)
    for g in summary.selected:
        assert f"{g} prompt 0 <b>&</b>" in doc.text and f"{g} prompt 2" in doc.text
    assert f"{TARGET_KEY} prompt 0" in doc.text and "The target: marathi" in doc.text
    assert not doc.all("b")  # the examples' markup is text
    # the evaluation: methods, target only and base model; best k starred; paired differences with intervals
    ev = doc.rows["evaluation-table"]
    assert [cells[0] for _, cells in ev] == ["KMM", "alignment", "random", "target only", "base model (no fine-tune)"]
    assert doc.headers["evaluation-table"] == ["method", "k = 1", "k = 2", "Borda"]
    assert sum("★" in c for _, cells in ev for c in cells) == 3 and "±" in ev[0][1][1]
    assert len(doc.rows["kmm-minus-table"]) == len(summary.evaluation["kmm_minus"]) == 6
    assert all(cells[3].startswith("[") for _, cells in doc.rows["kmm-minus-table"])
    assert len(doc.rows["best-k-table"]) == 3
    # the certificate, the cost, the provenance
    cert = dict(cells for _, cells in doc.rows["certificate-table"])
    assert cert["status"] == "optimal" and cert["KKT violation"].startswith("6.40e-17")
    assert cert["nnz (non-zero scores)"] == "3 of 7" and cert["multiplier"] == "0.01"
    assert "tokens featurised" in doc.text and "3,592.4" in doc.text and "featurize: retries 1" in doc.text
    assert "group 'x<y>': 2 example(s)" in doc.text
    assert {cells[0] for _, cells in doc.rows["packages-table"]} == {"convalue", "torch", "cvxpy"}
    assert "Run complete." in doc.text and "In short: Train on" in doc.text


def test_question_names_the_task_model_representation_metric_solver_and_k(tmp_path):
    run = make_run(tmp_path, LANGS, finetune=False, solver=_solver(gamma_ratio=0.05))
    doc = Doc(render_report(run))
    q = dict(cells for _, cells in doc.rows["question-table"])
    assert q["target task"].startswith("marathi (80 training") and q["candidates"].startswith("7 groups from jsonl")
    assert "SmolLM2" in q["model"] and q["representation"].startswith("one_step gradients of the lora")
    assert q["metric"] == "euclidean" and q["k (groups to select)"] == "2"
    assert "penalised (gamma = 0.01, gamma_ratio = 0.05" in q["solver"]
    budget = SolverRecord(form="budget", gamma=None, budget=1.5, method="pgd", status="optimal", objective=0.1,
                          kkt=1e-9)
    summary = RunSummary.read(run)
    summary.solver = budget
    summary.write(run)
    question = dict(cells for _, cells in Doc(render_report(run)).rows["question-table"])
    assert "budget (budget = 1.5" in question["solver"]


def test_group_names_and_texts_are_escaped_never_markup(tmp_path):
    names = [EVIL, "urdu & co", 'quote"d']
    run = make_run(tmp_path, names, k=3, seed=4)
    summary = RunSummary.read(run)
    summary.error = "<img src=x onerror=alert(1)>"
    summary.status, summary.failed_stage = "failed", "<finetune>"
    summary.write(run)
    page = render_report(run)
    doc = Doc(page)
    assert not doc.all("script") and len(doc.all("img")) == 2  # the error's <img> is text
    assert EVIL in [c[1] for c in doc.candidates()] and EVIL in doc.text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "<script" not in page
    assert "<img src=x onerror=alert(1)>" in doc.text and "<finetune>" in doc.text


def test_a_long_pool_shows_the_top_and_the_most_negative_and_counts_the_rest(tmp_path):
    n = 3000
    run = make_run(tmp_path, [f"cluster-{i:04d}" for i in range(n)], k=5, bootstrap=False, finetune=False)
    doc = Doc(render_report(run))
    cand = doc.candidates()
    assert len(cand) == RANKING_TOP + RANKING_NEGATIVE
    assert [c[0] for c in cand[:RANKING_TOP]] == [str(i) for i in range(1, RANKING_TOP + 1)]
    scores = pq.read_table(run / "scores.parquet").to_pylist()
    worst = sorted(scores, key=lambda r: r["score"])[:RANKING_NEGATIVE]
    assert {c[1] for c in cand[RANKING_TOP:]} == {r["group"] for r in worst}
    assert all(float(c[2]) < 0 for c in cand[RANKING_TOP:])
    omitted = [cells for cls, cells in doc.rows["ranking-table"] if cls == "omitted"]
    assert len(omitted) == 1 and omitted[0][0].startswith(f"… {n - 70} candidates omitted")
    assert f"{n - 70} omitted" in doc.text and "No confidence columns: the bootstrap was off" in doc.text


def test_a_pool_with_few_negatives_beyond_the_top_shows_those_only(tmp_path):
    run = make_run(tmp_path, [f"g{i}" for i in range(100)], bootstrap=False, finetune=False)
    table = pq.read_table(run / "scores.parquet")
    score = np.abs(table["score"].to_numpy()) + 1e-3
    score[-3:] *= -1  # three negatives, at the bottom
    pq.write_table(table.set_column(3, "score", pa.array(score)), run / "scores.parquet")
    cand = Doc(render_report(run)).candidates()
    assert len(cand) == RANKING_TOP + 3 and [c[0] for c in cand[-3:]] == ["98", "99", "100"]
    assert "47 candidates omitted" in render_report(run)


def test_a_failed_run_says_so_at_the_top_and_shows_what_exists(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    RunSummary(status="failed", failed_stage="featurize", error="RuntimeError: CUDA out of memory", signal=None,
               config={"finetune": {"enabled": True}, "select": {"k": 3}},
               data={"target": "marathi", "candidates": 12}, timings_s={"model": 1.0, "featurize": 9.0},
               progress={"featurize": {"done": 5, "total": 13, "seconds": 9.0}}).write(run)
    pq.write_table(pa.table({"group": [TARGET_KEY, "hindi"], "prompt": ["t", "h"], "response": ["r", "r"]}),
                   run / "examples.parquet")
    doc = Doc(render_report(run))
    banners = [(i, a) for i, (t, a) in enumerate(doc.tags) if "banner" in a.get("class", "").split()]
    first_section = next(i for i, (t, _) in enumerate(doc.tags) if t == "section")
    assert len(banners) == 1 and "failed" in banners[0][1]["class"] and banners[0][0] < first_section
    assert "This run FAILED in stage featurize: RuntimeError: CUDA out of memory." in doc.text
    assert "No ranking to show: the run failed in stage featurize before it wrote scores.parquet" in doc.text
    assert "No evaluation: the run failed in stage featurize" in doc.text and "No certificate" in doc.text
    assert "The target: marathi" in doc.text
    assert [cells[:2] for _, cells in doc.rows["timings-table"]] == [["model", "1.0"], ["featurize", "9.0"]]
    assert not doc.all("img") and "This part of the report could not be drawn" not in doc.text


def test_a_run_failed_in_its_fine_tunes_lists_those_that_finished(tmp_path):
    run = make_run(tmp_path, LANGS, finetune=False, status="failed", failed_stage="finetune",
                   error="KeyboardInterrupt: ", signal="SIGINT",
                   finetune_finished=[{"label": "target only", "seed": 0, "val_loss": 2.95}],
                   finetune_tuning={"by": "target_val:loss", "chosen": {"3": 0.25, "6": 0.75}})
    (run / "evaluation.png").unlink(missing_ok=True)
    doc = Doc(render_report(run))
    assert "This run FAILED in stage finetune" in doc.text and "stopped by SIGINT" in doc.text
    assert "1 fine-tune(s) finished before the failure" in doc.text
    assert "rho_k had been tuned on target_val:loss before the failure (k = 3: 0.25, k = 6: 0.75;" in doc.text
    assert len(doc.rows["finished-table"]) == 1 and len(doc.candidates()) == len(LANGS)


def test_a_running_run_says_it_has_not_finished(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    RunSummary(status="running", progress={"featurize": {"done": 3, "total": 9, "seconds": 1.0}}).write(run)
    doc = Doc(render_report(run))
    assert "This run has not finished" in doc.text and "Unfinished stage: featurize." in doc.text
    assert "no process holds the folder: it was stopped" in doc.text  # nothing holds the lock here
    assert "the run has not written scores.parquet yet" in doc.text


def test_a_uri_a_stale_evaluation_and_the_gram_record(tmp_path):
    has_gram = "gram" in {f.name for f in dataclasses.fields(RunSummary)}  # the blocked Gram's record, where kept
    run = make_run(tmp_path, LANGS, bootstrap=False, finetune_stale="KMM buys other groups at k in [2]",
                   **({"gram": {"panels": 4, "bytes_read": 12345}} if has_gram else {}))
    path = write_report(run.as_uri())
    assert Path(path) == run / "report.html"
    doc = Doc(Path(path).read_text(encoding="utf-8"))
    assert "The evaluation below is stale: KMM buys other groups" in doc.text
    if has_gram:
        assert dict(c for _, c in doc.rows["gram-table"]) == {"panels": "4", "bytes read": "12,345 (12.1 KiB)"}
    assert len(doc.candidates()) == len(LANGS) and "report.html" not in [c[0] for _, c in doc.rows["files-table"]]


def test_fine_tunes_off_and_no_examples_are_sentences(tmp_path):
    run = make_run(tmp_path, LANGS, finetune=False, bootstrap=False, examples=False)
    doc = Doc(render_report(run))
    assert "No evaluation: fine-tunes were off (finetune.enabled: false)" in doc.text
    assert "No examples to show: examples.parquet is not in the run folder." in doc.text
    assert "evaluation-table" not in doc.rows and len(doc.all("img")) == 1


def test_a_flat_pool_shows_its_clusters_examples(tmp_path):
    run = make_run(tmp_path, ["c0", "c1", "c2", "c3"], examples=False, finetune=False, k=4, seed=1)
    selected = RunSummary.read(run).selected
    pq.write_table(pa.table({"group": [g for g in ["c0", "c1", "c2", "c3"] for _ in range(4)],
                             "source_group": ["greetings", "ai", "greetings", "food"] * 4,
                             "index": list(range(16)), "prompt": [f"p{i}" for i in range(16)],
                             "response": [f"r{i}" for i in range(16)], "valued": [True] * 16}),
                   run / "clusters.parquet")
    doc = Doc(render_report(run))
    assert selected and "A cluster of 4 pooled examples, from:" in doc.text
    assert "prompt (from greetings)" in doc.text


def test_damaged_files_and_fields_are_reported_not_raised(tmp_path):
    run = make_run(tmp_path, LANGS)
    scores, summary = (run / "scores.parquet").read_bytes(), (run / "summary.json").read_text()
    (run / "scores.parquet").write_bytes(b"not parquet")
    (run / "evaluation.png").write_bytes(b"GIF89a")
    (run / "summary.json").write_text(summary.replace('"timings_s": {', '"timings_s": [1, {').replace(
        '"total": 93.0\n  }', '"total": 93.0\n  }]'))
    with pytest.raises(StoreError, match="timings_s"):
        RunSummary.read(run)
    doc = Doc(render_report(run))
    assert "summary.json was damaged" in doc.text and "shown without the field(s) ['timings_s']" in doc.text
    assert "Files that could not be used: scores.parquet cannot be read (ArrowInvalid" in doc.text
    assert "No ranking to show: scores.parquet cannot be read" in doc.text
    assert "summary.json's printed ranking" not in doc.text  # make_run's summary has none to fall back on
    assert "evaluation.png is not a PNG image" in doc.text
    assert [c[:2] for _, c in doc.rows["timings-table"]] == [["featurize", "–"]]  # progress kept, timings dropped
    assert len(doc.rows["evaluation-table"]) == 5 and "german prompt 1" in doc.text or "hebrew prompt 1" in doc.text
    # a table without the columns the page reads, and a field of a shape no section expects: each a sentence
    (run / "scores.parquet").write_bytes(scores)
    pq.write_table(pa.table({"group": ["hindi"]}), run / "bootstrap.parquet")
    (run / "summary.json").write_text(summary.replace('"best_k": {', '"best_k": {"oops": 3, ').replace(
        '"kkt": 6.4e-17', '"kkt": "tiny"'))
    doc = Doc(render_report(run))
    assert "bootstrap.parquet lacks the column(s)" in doc.text and len(doc.candidates()) == len(LANGS)
    assert "95% interval" not in doc.headers["ranking-table"]
    assert "evaluation-table" in doc.rows
    assert dict(c for _, c in doc.rows["certificate-table"])["KKT violation"].startswith("tiny")
    # learning curves of every damaged shape, and a select_by this version does not know: the evaluation stays
    data = json.loads(summary)
    good = {"method": "kmm", "k": 1, "evaluation": "target_val", "steps": [2, 4], "mean": [3.0, 2.5], "seeds": 3}
    data["evaluation"]["curves"] = [5, good | {"mean": []}, good | {"steps": 7}, good | {"method": 3},
                                    good | {"mean": ["x", None]}, {"evaluation": "target_val"}, good]
    (run / "summary.json").write_text(json.dumps(data))
    doc = Doc(render_report(run))
    assert "evaluation-table" in doc.rows and "lowest 2.5000 at step 4" in doc.text
    for damaged in (5, {"curves": 5}, {"select_by": "held:bogus", "curves": [good]}):
        data["evaluation"] = data["evaluation"] | damaged if isinstance(damaged, dict) else data["evaluation"] | {
            "curves": damaged}
        (run / "summary.json").write_text(json.dumps(data))
        doc = Doc(render_report(run))
        assert "evaluation-table" in doc.rows and "could not be drawn" not in doc.text


def test_a_folder_without_a_summary(tmp_path):
    doc = Doc(render_report(tmp_path))
    assert "No readable summary.json: there is no summary.json in the folder" in doc.text
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        write_report(tmp_path)
    (tmp_path / "summary.json").write_text("{damaged")
    assert "not readable JSON" in Doc(write_report(tmp_path).read_text()).text


def test_report_of_a_folder_with_a_damaged_file_says_so_and_exits_1(tmp_path, capsys):
    from convalue.engine.driver.cli import main

    run = make_run(tmp_path, LANGS)
    assert main(["report", str(run)]) == 0 and "Run complete." in Doc((run / "report.html").read_text()).text
    (run / "scores.parquet").write_bytes(b"PAR1 damaged")
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("convalue: warning: 1 file(s) of the run folder could not be used: scores.parquet cannot "
                          "be read") and "\n" not in err
    assert "Run complete, but 1 of its files cannot be used (listed below)." in Doc(
        (run / "report.html").read_text()).text


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason=f"no headless browser installed (looked for {', '.join(BROWSERS)})")
def test_a_headless_browser_renders_the_tables(tmp_path):
    path = write_report(make_run(tmp_path, LANGS))
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = Doc(out.stdout)
    assert len(doc.candidates()) == len(LANGS) and len(doc.rows["evaluation-table"]) == 5
    assert len(doc.all("img")) == 2 and "Run complete." in doc.text
