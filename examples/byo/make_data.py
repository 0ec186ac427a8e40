"""Regenerate the bring-your-own example's data files from the installed chatterbot-corpus package.

    .venv/bin/python examples/byo/make_data.py

Writes, next to this script:
- computers.jsonl: the target task, every prompt/response pair of chatterbot's English `computers` topic
  (one JSON object per line: {"prompt": ..., "response": ...});
- pool.parquet: the candidate pool, the first PER_GROUP pairs of six other English topics, one row per pair,
  with the columns group, prompt, response (the `group` column names the candidate dataset).

Pairs are consecutive turns of a chatterbot conversation, read by convalue's own chatterbot source, so the
files hold exactly the text a `kind: chatterbot` source would give. The output is the same on every run.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from convalue.engine.config import SourceConfig
from convalue.engine.data.sources import load_source

HERE = Path(__file__).resolve().parent
TARGET_TOPIC = "computers"
POOL_TOPICS = ["ai", "coding", "food", "science", "sports", "tech_support"]
PER_GROUP = 20  # rows per candidate group (food has 17: all of them)


@functools.cache
def english_topics() -> dict:
    """chatterbot's English topics as convalue's chatterbot source reads them: {"english/<topic>": Group}."""
    return load_source(SourceConfig(kind="chatterbot", group_by="language/topic",
                                    include=[f"english/{t}" for t in [TARGET_TOPIC, *POOL_TOPICS]]))


def pairs(topic: str, n: int | None = None) -> list[dict]:
    """The first n prompt/response pairs of one English chatterbot topic (all of them when n is None)."""
    group = english_topics()[f"english/{topic}"]
    return [{"prompt": ex.messages[0][1], "response": ex.messages[1][1]} for ex in group.examples[:n]]


def main() -> None:
    target = pairs(TARGET_TOPIC)
    with (HERE / f"{TARGET_TOPIC}.jsonl").open("w", encoding="utf-8") as fh:
        for row in target:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    rows = [{"group": topic, **row} for topic in POOL_TOPICS for row in pairs(topic, PER_GROUP)]
    table = pa.Table.from_pylist(rows, schema=pa.schema([("group", pa.string()), ("prompt", pa.string()),
                                                          ("response", pa.string())]))
    pq.write_table(table, HERE / "pool.parquet")
    print(f"{TARGET_TOPIC}.jsonl: {len(target)} pairs; pool.parquet: {len(rows)} rows in {len(POOL_TOPICS)} groups")


if __name__ == "__main__":
    main()
