"""report.html's words for raw records: a source config without a path reads without a `None`, Ray nodes by host
and address (ids only on hover), and a font stack naming a face for each script of the built-in corpus."""

from __future__ import annotations

from convalue.engine.data.sources import chatterbot_root
from convalue.engine.report.fonts import FONTS, LANG_RULES, LANGUAGE_TAGS, lang_of
from convalue.engine.report.run_words import gram_pairs, node_labels, source_words


def test_a_source_reads_as_its_config_gives_it():
    demo = {"kind": "chatterbot", "path": None, "group_by": "language", "include": None, "exclude": ["marathi"]}
    assert source_words(demo) == "chatterbot without marathi, by language"
    pool = {"kind": "jsonl", "path": "pool.jsonl", "include": list("abcdefgh"), "clusters": 50}
    assert source_words(pool) == "jsonl pool.jsonl (a, b, c, d, e, f and 2 more), in 50 clusters"
    assert source_words(None) == "?"


def test_nodes_are_named_by_host_and_address_the_drivers_first():
    one = {"tiles_per_node": {"n1": 3}, "nodes": {"n1": {"ip": "127.0.0.1", "host": "box", "driver": True}}}
    assert node_labels(one) == {"n1": "the run's one machine (box, 127.0.0.1)"}
    two = {"tiles_per_node": {"w": 3, "h": 5}, "nodes": {"w": {"ip": "10.0.0.2", "host": "w1", "driver": False},
                                                          "h": {"ip": "10.0.0.1", "host": "head", "driver": True}},
           "bytes_read": 1_572_864, "bytes_moved": 0, "panels": 2}
    assert node_labels(two) == {"h": "node 1 (head, 10.0.0.1), the driver's", "w": "node 2 (w1, 10.0.0.2)"}
    rows = dict(gram_pairs(two))
    assert rows["tiles per node"].startswith('<span title="Ray node id h">node 1 (head, 10.0.0.1), the driver')
    assert rows["bytes read"] == "1,572,864 (1.5 MiB)" and rows["bytes moved"] == "0" and "nodes" not in rows
    old = {"tiles_per_node": {"812e6dbec285": 3}}  # a run recorded before the addresses were
    assert node_labels(old) == {"812e6dbec285": "node 1"}


def test_the_font_stack_covers_every_script_of_chatterbot():
    languages = {p.name for p in chatterbot_root().iterdir() if p.is_dir()}
    assert languages <= set(LANGUAGE_TAGS), f"no language tag for {languages - set(LANGUAGE_TAGS)}"
    for face in ("Noto Sans", "Noto Sans Devanagari", "Noto Sans Bengali", "Noto Sans Oriya", "Noto Sans Tamil",
                 "Noto Sans Telugu", "Noto Sans Arabic", "Noto Sans Hebrew", "Noto Sans Thai", "Noto Sans CJK SC",
                 "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Sans CJK KR"):
        assert f'"{face}"' in FONTS
    assert FONTS.endswith(",sans-serif") and FONTS.index("Noto Sans CJK SC") < FONTS.index("Noto Sans CJK JP")
    assert ':lang(ja){font-family:' in LANG_RULES
    japanese = LANG_RULES.split(":lang(ja){", 1)[1]
    assert japanese.index("Noto Sans CJK JP") < japanese.index("Noto Sans CJK SC")
    assert lang_of("japanese/food") == "ja" and lang_of("traditionalchinese") == "zh-Hant" and lang_of("c17") is None
