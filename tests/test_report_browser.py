"""report.html in a real headless browser (Debian's chromium): a run folder of real chatterbot prompts in a dozen
scripts, the page's DOM as the browser built it (the sections, the question without a stray `None`, the Gram's
nodes by name) and a screenshot that is a real, non-blank picture. One browser launch (per module) makes both.
Skipped where no chromium is installed (`make test` installs it where it can: root with apt-get)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import chatterbot_pairs
from test_report_html import Doc, make_run

from convalue.engine.report.html import write_report
from convalue.engine.report.html_sections import TARGET_KEY
from convalue.engine.store.summary import RunSummary

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason=f"no headless chromium installed (looked for "
                                                        f"{', '.join(BROWSERS)}; apt-get install chromium)")
#: one language of each script chatterbot holds beside Latin: Devanagari, Bengali, Odia, Tamil, Arabic (Persian,
#: Urdu), Telugu, Hebrew, Thai, Chinese, Japanese, Korean, Cyrillic; make_run's seed 1 scores all but the 4th, 7th
#: and last positive, so the selection shows the other ten's prompts
LANGS = ["hindi", "bengali", "oriya", "tamil", "persian", "urdu", "telugu", "hebrew", "thai", "chinese", "japanese",
         "korean", "russian"]
NODE = "812e6dbec2857197d0aa863f76fd18ed3e2ec0216d786664cfd0685c"
#: the screenshot's window: the page's top 4000 pixels (the DOM holds the whole page whatever the window)
WINDOW = (1280, 4000)


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless chromium with no network of its own, no first-run or background work, a profile of its own."""
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def _multilingual_run(tmp_path: Path, pairs: dict[str, list[dict]]) -> Path:
    """A finished run folder valuing chatterbot languages for Marathi, as the demo's config writes it (the pool's
    source without a path), with real prompts of every script (3 of each language in `pairs`) and the Gram's
    tiles on one node."""
    run = make_run(tmp_path, LANGS, k=10, seed=1, gram={"panels": 2, "tiles": 3, "tiles_per_node": {NODE: 3},
                                              "nodes": {NODE: {"ip": "127.0.0.1", "host": "buildhost",
                                                               "driver": True}},
                                              "bytes_moved": 0, "bytes_read": 1_572_864})
    summary = RunSummary.read(run)
    summary.config["data"] = {"target": {"kind": "chatterbot", "path": None, "group_by": "language",
                                         "include": ["marathi"], "exclude": []},
                              "candidates": [{"kind": "chatterbot", "path": None, "group_by": "language",
                                              "include": None, "exclude": ["marathi"], "clusters": None}]}
    summary.write(run)
    rows = [(g, p) for g in [TARGET_KEY, *LANGS] for p in pairs["marathi" if g == TARGET_KEY else g]]
    pq.write_table(pa.table({"group": [g for g, _ in rows], "prompt": [p["prompt"] for _, p in rows],
                             "response": [p["response"] for _, p in rows]}), run / "examples.parquet")
    return run


@dataclass(frozen=True)
class Rendered:
    """What one headless chromium made of the multilingual run's report.html."""

    report: Path
    pairs: dict[str, list[dict]]
    dom: str
    screenshot: Path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    """The report of the multilingual run, opened once: chromium writes the DOM it built to stdout and a
    screenshot of its window to a file in the same launch (--dump-dom and --screenshot together)."""
    tmp = tmp_path_factory.mktemp("browser")
    pairs = {lang: chatterbot_pairs(lang, 3) for lang in ["marathi", *LANGS]}
    path = write_report(_multilingual_run(tmp, pairs))
    shot = tmp / "report.png"
    out = _browser(tmp, "--dump-dom", f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                   "--hide-scrollbars", path.as_uri())
    return Rendered(path, pairs, out.stdout, shot)


def test_the_browser_builds_every_section_names_the_source_and_the_node(rendered):
    path = rendered.report
    doc = Doc(rendered.dom)
    assert {a.get("id") for a in doc.all("section")} == {"question", "ranking", "selection", "evaluation",
                                                          "certificate", "cost", "provenance"}
    assert len(doc.candidates()) == len(LANGS) and len(doc.all("img")) == 2
    question = dict(cells for _, cells in doc.rows["question-table"])
    assert question["candidates"] == f"{len(LANGS)} groups from chatterbot without marathi, by language"
    assert "None" not in " ".join(question.values())
    gram = dict(cells for _, cells in doc.rows["gram-table"])
    assert gram["tiles per node"] == "the run's one machine (buildhost, 127.0.0.1): 3"
    assert gram["bytes read"] == "1,572,864 (1.5 MiB)" and NODE not in doc.text  # the id only on hover
    # each example's text in its language (Han drawn in its Japanese forms, Hebrew and Urdu right to left)
    assert {a.get("lang") for a in doc.all("div") if "txt" in a.get("class", "")} >= {"ja", "zh-Hans", "he", "ur"}
    selected = RunSummary.read(path.parent).selected
    assert len(selected) == 10
    for lang in selected:  # the selected groups' prompts, in their own scripts
        assert " ".join(rendered.pairs[lang][0]["prompt"].split()) in doc.text


def test_the_screenshot_is_a_real_picture_of_the_page(rendered):
    from PIL import Image  # matplotlib's dependency; only this test decodes a PNG

    shot = rendered.screenshot
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(shot).convert("L")
    assert image.size == WINDOW
    histogram = image.histogram()
    dark = sum(histogram[:128]) / sum(histogram)  # text, borders, the plots
    assert 0.002 < dark < 0.5, f"{dark:.4f} of the pixels are dark: a blank or black page"
    assert len([n for n in histogram if n]) > 32  # anti-aliased text and coloured rows, not one flat colour
