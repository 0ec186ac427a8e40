"""Config validation: every error names the file, the field and the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from convalue.engine.config import ConfigError, load_config, reference_markdown

BASE = {
    "name": "x",
    "data": {"target": {"kind": "chatterbot", "include": ["marathi"]},
             "candidates": [{"kind": "chatterbot", "exclude": ["marathi"]}]},
}


def write(tmp_path, data, name="run.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def merged(**sections):
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for k, v in sections.items():
        out[k] = v
    return out


def test_valid_config_round_trip(tmp_path):
    cfg = load_config(write(tmp_path, merged(solver={"budget": 2}, finetune={"lr": "1e-4"})))
    assert cfg.solver.budget == 2.0 and cfg.solver.gamma is None
    assert cfg.finetune.lr == pytest.approx(1e-4)  # YAML 1.1 reads 1e-4 as a string; accepted as a number
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.to_dict()["data"]["target"]["include"] == ["marathi"]


def test_mappings_per_budget_and_per_group(tmp_path):
    """finetune.rho_by_k (Alg. 1's rho_k) and finetune.mixture_weights are mappings; a budget's key written as
    text (a JSON round trip) reads back as the int."""
    cfg = load_config(write(tmp_path, merged(select={"k": 2}, finetune={
        "ks": [1, 2, 3], "rho_by_k": {1: 0.75, "3": 0.25}, "mixture": "given",
        "mixture_weights": {"english": 2, "hindi": 0.8}})))
    assert cfg.finetune.rho_by_k == {1: 0.75, 3: 0.25}
    assert [cfg.finetune.rho_at(k) for k in (1, 2, 3, None)] == [0.75, 0.5, 0.25, 0.5]
    assert cfg.finetune.mixture_weights == {"english": 2.0, "hindi": 0.8}
    assert "mapping of int to number" in reference_markdown()


def test_demo_config_is_valid():
    cfg = load_config(Path(__file__).parents[1] / "examples" / "demo.yaml")
    assert cfg.data.target.include == ["marathi/conversations"]
    # judged on a Marathi topic the target does not train on
    assert cfg.data.eval["greetings"].include == ["marathi/greetings"]
    assert cfg.finetune.select_by_parts() == ("greetings", "loss")


def test_flat_pool_example_is_valid():
    cfg = load_config(Path(__file__).parents[1] / "examples" / "flat_pool.yaml")
    assert cfg.data.candidates[0].clusters == 16 and len(cfg.data.candidates[0].include) == 20


@pytest.mark.parametrize(
    ("data", "field", "value_repr"),
    [
        (merged(solver={"gamma": -0.1}), "solver.gamma", "-0.1"),
        (merged(select={"k": 0}), "select.k", "0"),
        (merged(select={"k": -2}), "select.k", "-2"),
        (merged(model={"source": "/no/such/model"}), "model.source", "/no/such/model"),
        (merged(lora={"rank": 8}), "lora.rank", "8"),
        (merged(data=BASE["data"] | {"preview_size": 0}), "data.preview_size", "0"),
        (merged(data=BASE["data"] | {"candidates": []}), "data.candidates", "[]"),
        (merged(projection={"dim": 0}), "projection.dim", "0"),
        (merged(solver={"gamma": 0.1, "budget": 2}), "solver.gamma", "budget"),
        (merged(solver={"gamma": 0.1, "tol": 0.0}), "solver.tol", "0.0"),
        (merged(solver={"gamma": 0.1, "tol": 0.01}), "solver.tol", "0.01"),
        (merged(solver={"budget": 2, "tol": 1e-6}), "solver.tol", "1e-06"),
        (merged(solver={"gamma": 0.1, "tol": 1e-6, "method": "cvxpy"}), "solver.tol", "1e-06"),
        (merged(finetune={"rho": 1.5}), "finetune.rho", "1.5"),
        (merged(finetune={"ks": [1, 3, 1]}), "finetune.ks", "[1, 3, 1]"),
        (merged(bootstrap={"samples": -1}), "bootstrap.samples", "-1"),
        (merged(bootstrap={"samples": 20}), "bootstrap.samples", "20"),  # without features.keep_per_example
        (merged(finetune={"ks": [0, 2]}), "finetune.ks", "[0, 2]"),
        (merged(finetune={"ks": []}), "finetune.ks", "[]"),
        (merged(finetune={"ks": ["two"]}), "finetune.ks[0]", "two"),
        (merged(finetune={"baselines": ["random", "random"]}), "finetune.baselines", "['random', 'random']"),
        (merged(finetune={"baselines": ["one_step"]}), "finetune.baselines[0]", "one_step"),
        (merged(ray={"workers": "two"}), "ray.workers", "two"),
        (merged(data=BASE["data"] | {"target": {"kind": "xml", "path": "x"}}), "data.target.kind", "xml"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "jsonl", "path": "/no/file.jsonl"}]}),
         "data.candidates[0].path", "/no/file.jsonl"),
        (merged(colour="blue"), "colour", "blue"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "chatterbot", "clusters": 1}]}),
         "data.candidates[0].clusters", "1"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "chatterbot", "embedding": "/no/encoder"}]}),
         "data.candidates[0].embedding", "/no/encoder"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "chatterbot", "clusters": 4,
                                                     "embedding": "/no/encoder"}]}),
         "data.candidates[0].embedding", "/no/encoder"),
        (merged(data=BASE["data"] | {"target": {"kind": "chatterbot", "include": ["marathi"], "clusters": 2}}),
         "data.target.clusters", "2"),
        (merged(finetune={"ks": [1, 3], "rho_by_k": {5: 0.5}}), "finetune.rho_by_k.5", "0.5"),  # k not evaluated
        (merged(finetune={"rho_by_k": {1: 1.5}}), "finetune.rho_by_k.1", "1.5"),
        (merged(finetune={"random_orders": "each"}), "finetune.random_orders", "each"),
        (merged(finetune={"rho_by_k": {"one": 0.5}}), "finetune.rho_by_k.one", "one"),
        (merged(finetune={"rho_by_k": [0.5]}), "finetune.rho_by_k", "[0.5]"),
        (merged(finetune={"mixture": "given"}), "finetune.mixture_weights", "given"),
        (merged(finetune={"mixture_weights": {"hindi": 2}}), "finetune.mixture", "uniform"),
        (merged(finetune={"mixture": "given", "mixture_weights": {"hindi": 0}}), "finetune.mixture_weights.hindi",
         "0"),
        (merged(finetune={"mixture": "given", "mixture_weights": {"hindi": "lots"}}),
         "finetune.mixture_weights.hindi", "lots"),
        (merged(finetune={"mixture_default_weight": 0.8}), "finetune.mixture", "uniform"),
        (merged(finetune={"mixture": "given", "mixture_weights": {"hindi": 2}, "mixture_default_weight": -1}),
         "finetune.mixture_default_weight", "-1"),
        (merged(model={"source": "not a model!"}), "model.source", "not a model!"),
        (merged(model={"source": "./org/name"}), "model.source", "org/name"),  # `./`: a folder, not a hub id
        (merged(model={"source": "org/name", "revision": " "}), "model.revision", "' '"),
        (merged(model={"revision": "v2"}), "model.revision", "v2"),  # the built-in model has no revisions
        (merged(solver={"gamma": 0.1, "gamma_ratio": 0.1}), "solver.gamma", "gamma_ratio"),
        (merged(solver={"gamma_ratio": -0.5}), "solver.gamma_ratio", "-0.5"),
        (merged(solver={"gamma_ratio": ".inf"}), "solver.gamma_ratio", "inf"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "chatterbot", "split": "train"}]}),
         "data.candidates[0].split", "train"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "hf", "path": "a/b/c"}]}),
         "data.candidates[0].path", "a/b/c"),
        (merged(data=BASE["data"] | {"candidates": [{"kind": "hf", "path": "org/name", "name": ""}]}),
         "data.candidates[0].name", "''"),
    ],
)
def test_field_errors_name_file_field_and_value(tmp_path, data, field, value_repr):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and field in msg and value_repr in msg, msg
    assert err.value.field == field


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")


def test_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(write(tmp_path, "data: [unclosed\n  - x: {"))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.yaml.*not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config(latin)


def test_empty_and_missing_required(tmp_path):
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, ""))
    with pytest.raises(ConfigError, match="data: is required"):
        load_config(write(tmp_path, {"name": "x"}))


def test_reference_documents_every_section():
    ref = reference_markdown()
    for section in ("`model`", "`lora`", "`data`", "`data.target`", "`projection`", "`solver`", "`select`",
                    "`finetune`", "`ray`", "preview_size", "max_in_flight"):
        assert section in ref


def test_out_that_cannot_hold_the_run_folder(tmp_path):
    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile", tmp_path / "afile" / "deeper"):
        with pytest.raises(ConfigError, match=r"run folder .* cannot be made: .*afile is a file") as err:
            load_config(write(tmp_path, merged(out=str(out))))
        assert err.value.field == "out"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x").write_text("")  # the run folder's own name taken by a file
    with pytest.raises(ConfigError, match=r"runs/x is a file"):
        load_config(write(tmp_path, merged(out=str(tmp_path / "runs"))))
    assert load_config(write(tmp_path, merged(out=str(tmp_path / "new" / "runs")))).out.endswith("new/runs")


def test_a_hub_id_is_checked_for_its_form_only(tmp_path):
    """A hub id is resolved when the run starts (the cache, or the hub); at config time only its form is checked."""
    cfg = load_config(write(tmp_path, merged(model={"source": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                    "revision": "v1.0"})))
    assert (cfg.model.source, cfg.model.revision, cfg.model.on_hub()) == ("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                                          "v1.0", True)
    assert cfg.to_dict()["model"]["revision"] == "v1.0"
    # a folder of that name beside the config is a local model, not a hub id
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    local = load_config(write(tmp_path, merged(model={"source": "org/name"})))
    assert local.model.source == str(tmp_path / "org" / "name") and not local.model.on_hub()


def test_relative_paths_are_read_against_the_config_file(tmp_path, monkeypatch):
    """Every path of a config: data files and folders, an encoder folder, costs, a model folder, its cache, a reward
    file, out; absolute and `~` paths are kept as written."""
    cfgs, data = tmp_path / "cfgs", tmp_path / "data"
    cfgs.mkdir()
    data.mkdir()
    (data / "t.jsonl").write_text('{"prompt": "a", "response": "b"}\n')
    (data / "pool").mkdir()
    (cfgs / "prices.json").write_text("{}")
    (cfgs / "enc").mkdir()
    (cfgs / "enc" / "config.json").write_text("{}")
    (cfgs / "model").mkdir()
    (cfgs / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "data")  # anywhere but the config's folder
    cfg = load_config(write(cfgs, {
        "name": "x", "out": "out", "model": {"source": "model", "cache_dir": "cache"},
        "features": {"grpo_reward": "rewards.py:score"},
        "finetune": {"grpo_reward": "rewards.py:train", "accuracy_reward": "rewards.py:acc"},
        "data": {"target": {"kind": "jsonl", "path": "../data/t.jsonl"},
                 "candidates": [{"kind": "folder", "path": "../data/pool", "clusters": 2, "embedding": "enc"},
                                {"kind": "jsonl", "path": str(data / "t.jsonl")}]},
        "solver": {"gamma": 0.1, "costs_file": "prices.json"}}))
    assert cfg.out == str(cfgs / "out") and cfg.model.source == str(cfgs / "model")
    assert cfg.model.cache_dir == str(cfgs / "cache") and cfg.solver.costs_file == str(cfgs / "prices.json")
    assert cfg.features.grpo_reward == f"{cfgs / 'rewards.py'}:score"
    assert (cfg.finetune.grpo_reward, cfg.finetune.accuracy_reward) == (f"{cfgs / 'rewards.py'}:train",
                                                                        f"{cfgs / 'rewards.py'}:acc")
    assert cfg.data.target.path == str(data / "t.jsonl")
    pool, absolute = cfg.data.candidates
    assert (pool.path, pool.embedding) == (str(data / "pool"), str(cfgs / "enc"))
    assert absolute.path == str(data / "t.jsonl")
    assert load_config(write(cfgs, merged(out="~/runs"))).out == "~/runs"


def test_a_file_s_extension_must_match_its_kind(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a"], "response": ["b"]}), tmp_path / "pool.parquet")
    (tmp_path / "pool.parquet.gz").write_bytes(b"")
    for kind, path, field, says in (("jsonl", "pool.parquet", "kind", "a `parquet` file: use kind `parquet`"),
                                    ("parquet", "pool.parquet.gz", "path", "gzipped Parquet")):
        data = merged(data=BASE["data"] | {"candidates": [{"kind": kind, "path": path}]})
        with pytest.raises(ConfigError, match=says) as err:
            load_config(write(tmp_path, data))
        assert err.value.field == f"data.candidates[0].{field}"


def test_missing_extras_are_named_at_config_time(tmp_path, monkeypatch):
    """solver.method cvxpy needs [reference], kind `hf` needs [hf]: the config says which extra to install."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("cvxpy", "datasets") else real(name, *a))
    with pytest.raises(ConfigError, match=r"solver.method: needs CVXPY and OSQP: pip install 'convalue\[reference\]'"):
        load_config(write(tmp_path, merged(solver={"gamma": 0.1, "method": "cvxpy"})))
    with pytest.raises(ConfigError, match=r"data.candidates\[0\].kind: `hf` needs the `datasets` package: pip install "
                                          r"'convalue\[hf\]'"):
        load_config(write(tmp_path, merged(data=BASE["data"] | {"candidates": [{"kind": "hf", "path": "org/x"}]})))


def test_set_overrides_a_field_and_is_validated_like_the_file(tmp_path):
    import yaml

    from convalue.engine.config import ConfigError, load_config

    target = tmp_path / "t.jsonl"
    target.write_text('{"prompt": "a", "response": "b"}\n')
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"target": {"kind": "jsonl", "path": "t.jsonl"}, "candidates": [{"kind": "chatterbot"}]},
        "solver": {"gamma": 0.05}}))
    cfg = load_config(tmp_path / "run.yaml", ["solver.gamma=0.1", "finetune.ks=[1, 3]", "ray.dashboard=true",
                                               "name=sweep-0.1"])
    assert cfg.solver.gamma == 0.1 and cfg.finetune.ks == [1, 3] and cfg.ray.dashboard and cfg.name == "sweep-0.1"
    assert cfg.data.target.path == str(target)  # the file's own relative paths still read against its folder
    with pytest.raises(ConfigError, match=r"run.yaml: solver.gamma: must be a finite number >= 0 \(got -1.0\)"):
        load_config(tmp_path / "run.yaml", ["solver.gamma=-1"])
    with pytest.raises(ConfigError, match=r"solver.nope: unknown field"):
        load_config(tmp_path / "run.yaml", ["solver.nope=1"])
    with pytest.raises(ConfigError, match=r"--set takes key.path=value"):
        load_config(tmp_path / "run.yaml", ["solver.gamma"])
    listed = load_config(tmp_path / "run.yaml", ["data.candidates.0.include=[hindi, urdu]"])  # a list item by index
    assert listed.data.candidates[0].include == ["hindi", "urdu"]
    with pytest.raises(ConfigError, match=r"--set data.candidates.1.include: data.candidates has 1 item\(s\)"):
        load_config(tmp_path / "run.yaml", ["data.candidates.1.include=[hindi]"])
    with pytest.raises(ConfigError, match=r"--set solver.gamma.x: solver.gamma is not a section"):
        load_config(tmp_path / "run.yaml", ["solver.gamma.x=1"])
