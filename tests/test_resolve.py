"""`convalue solve`: a finished run re-solved from its saved K and beta or its stored vectors; damaged folders
refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import forget_checksum, own_copy, snapshot

from convalue.engine.config import ConfigError, config_from_dict
from convalue.engine.driver.pipeline import run
from convalue.engine.driver.resolve import resolve
from convalue.engine.store.vectors import StoreError
from convalue.solvers import KMMInputError, solve_kmm

pytestmark = pytest.mark.heavy  # whole runs: scheduled before the light modules (conftest.py)

COLUMNS = ["group", "n_examples", "n_preview", "score", "beta", "cosine", "rank", "selected"]


def test_resolving_saved_gram_gives_saved_scores(first_run, tmp_path):
    _, data, summary = first_run
    run_dir = own_copy(first_run, tmp_path / "t")
    saved = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    K, beta = np.load(run_dir / "gram.npy"), np.load(run_dir / "beta.npy")
    sol = solve_kmm(K, beta, gamma=data["solver"]["gamma"], normalize=data["solver"]["normalize"])
    np.testing.assert_allclose(sol.w, [saved[n] for n in summary.order], atol=1e-9)
    out = resolve(run_dir, gamma=None, budget=None, method=None, normalize=None)
    again = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    assert again == pytest.approx(saved, abs=1e-9)
    assert out.resolved and out.solver.gamma == data["solver"]["gamma"]
    assert out.solver.rank_bound == summary.solver.rank_bound  # passed again to the re-solve


def test_resolve_with_a_budget_rewrites_scores(first_run, tmp_path):
    run_dir = own_copy(first_run, tmp_path / "t")
    out = resolve(run_dir, gamma=None, budget=1.5, method=None, normalize=None)
    assert out.solver.form == "budget" and out.solver.l1 <= 1.5 + 1e-6
    table = pq.read_table(run_dir / "scores.parquet").to_pylist()
    assert sum(abs(r["score"]) for r in table) <= 1.5 + 1e-6


def test_resolve_with_a_tolerance_records_it_and_a_budget_drops_it(first_run, tmp_path):
    """--tol reaches the solver (certified at it, echoed in the summary); a later re-solve keeps the run's tol in the
    penalised form and leaves it out of the budget form, which is always exact."""
    _, data, _ = first_run
    run_dir = own_copy(first_run, tmp_path / "tol")
    out = resolve(run_dir, gamma=data["solver"]["gamma"], budget=None, method=None, normalize=None, tol=1e-6)
    beta = np.load(run_dir / "beta.npy")
    assert out.solver.info["tol"] == 1e-6 and out.solver.kkt <= 1e-6 * max(1.0, float(np.abs(beta).max()))
    again = resolve(run_dir, gamma=None, budget=None, method=None, normalize=None)
    assert again.solver.info["tol"] == 1e-6
    budget = resolve(run_dir, gamma=None, budget=1.5, method=None, normalize=None)
    assert budget.solver.form == "budget" and "tol" not in budget.solver.info
    with pytest.raises(KMMInputError, match="budget form is always solved exactly"):
        resolve(run_dir, gamma=None, budget=1.5, method=None, normalize=None, tol=1e-6)
    from convalue.engine.driver.cli import main

    before = (run_dir / "scores.parquet").read_bytes()
    assert main(["solve", str(run_dir), "--budget", "1.5", "--tol", "1e-6"]) == 2  # a user error, scores untouched
    assert (run_dir / "scores.parquet").read_bytes() == before
    assert main(["solve", str(run_dir), "--gamma", str(data["solver"]["gamma"]), "--tol", "1e-5"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["solver"]["tol"] == 1e-5


def test_resolve_marks_fine_tunes_stale_only_while_the_selection_differs(first_run, tmp_path):
    """A re-solve that changes the selection flags the fine-tunes as stale; one back to their selection clears it."""
    _, data, first = first_run
    run_dir = own_copy(first_run, tmp_path / "copy")
    tuned = next(r["groups"] for r in first.finetune if r["method"] == "kmm" and r["k"] == 2)  # select.k
    beta = np.load(run_dir / "beta.npy")
    out = resolve(run_dir, gamma=2 * float(np.abs(beta).max()), budget=None, method=None, normalize=None)
    assert out.selected == [] and out.finetune_stale is not None  # gamma above max|beta|: w = 0, nothing selected
    out = resolve(run_dir, gamma=data["solver"]["gamma"], budget=None, method=None, normalize=None)
    assert sorted(out.selected) == tuned
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert out.finetune_stale is None and "finetune_stale" not in on_disk


def test_resolve_marks_softmax_fine_tunes_stale_when_their_weights_change(first_run, tmp_path):
    """With finetune.mixture softmax a KMM run's weights follow w: a re-solve that keeps its groups but not its
    weights leaves it stale; the tuned weights keep it current."""
    _, data, first = first_run
    run_dir = tmp_path / "soft"
    own_copy(first_run, run_dir)
    gamma = data["solver"]["gamma"]
    resolve(run_dir, gamma=gamma, budget=None, method=None, normalize=None)  # the tuned solve, as the run left it
    summary = json.loads((run_dir / "summary.json").read_text())
    w = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    rows = [dict(r) for r in first.finetune]
    kmm2 = next(r for r in rows if r["method"] == "kmm" and r["k"] == 2)
    assert len(kmm2["groups"]) == 2
    e = {g: float(np.exp(w[g])) for g in kmm2["groups"]}
    kmm2["weights"] = {g: v / sum(e.values()) for g, v in e.items()}  # as the tuned run drew them
    config = summary["config"] | {"finetune": summary["config"]["finetune"] | {"mixture": "softmax"}}
    (run_dir / "summary.json").write_text(json.dumps(summary | {"finetune": rows, "config": config}))
    assert resolve(run_dir, gamma=gamma, budget=None, method=None, normalize=None).finetune_stale is None
    kmm2["weights"] = {g: 0.5 for g in kmm2["groups"]}  # weights another solution would give
    (run_dir / "summary.json").write_text(json.dumps(summary | {"finetune": rows, "config": config}))
    out = resolve(run_dir, gamma=gamma, budget=None, method=None, normalize=None)
    assert sorted(out.selected) == kmm2["groups"] and "k = [2]" in out.finetune_stale


def test_resolve_reads_fine_tunes_saved_before_the_evaluation_protocol(first_run, tmp_path):
    """An older summary lists KMM's top-select.k fine-tune first, without `method` and `k`."""
    _, data, first = first_run
    run_dir = tmp_path / "old"
    own_copy(first_run, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    old_rows = [{k: v for k, v in r.items() if k not in ("method", "k", "points", "best")}
                for r in first.finetune if r["method"] in ("kmm", "target_only") and r["k"] in (2, None)]
    (run_dir / "summary.json").write_text(json.dumps(summary | {"finetune": old_rows}))
    beta = np.load(run_dir / "beta.npy")
    away = resolve(run_dir, gamma=2 * float(np.abs(beta).max()), budget=None, method=None, normalize=None)
    assert away.finetune_stale is not None
    back = resolve(run_dir, gamma=data["solver"]["gamma"], budget=None, method=None, normalize=None)
    assert back.finetune_stale is None


def test_resolve_names_the_saved_file_that_is_bad_and_keeps_the_scores(first_run, tmp_path):
    """A re-solve of a damaged run folder fails naming the file and value; scores.parquet is left as it was."""
    run_dir = tmp_path / "copy"
    own_copy(first_run, run_dir)
    scores_before = (run_dir / "scores.parquet").read_bytes()
    K = np.load(run_dir / "gram.npy")
    K[1, 0] = np.inf
    np.save(run_dir / "gram.npy", K)
    forget_checksum(run_dir, "gram.npy")  # a K put there by hand: validated as one from outside
    with pytest.raises(KMMInputError, match=r"copy \(beta.npy, gram.npy\): K contains NaN or inf: K\[1, 0\] = inf"):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
    (run_dir / "beta.npy").write_bytes(b"not an array")
    with pytest.raises(StoreError, match=r"beta.npy: not a readable .npy array"):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
    assert (run_dir / "scores.parquet").read_bytes() == scores_before


def test_a_flipped_byte_in_a_saved_array_is_refused_and_reported(first_run, tmp_path):
    """beta.npy with 8 bytes changed still parses, and would change the selection: its recorded SHA-256 refuses it
    in `convalue solve` (scores kept) and `convalue status` names it."""
    from convalue.engine.store.status import run_status

    run_dir = own_copy(first_run, tmp_path / "flip")
    assert set(json.loads((run_dir / "summary.json").read_text())["artifacts"]) >= {"gram.npy", "beta.npy"}
    assert run_status(run_dir).state == "complete"
    scores_before = (run_dir / "scores.parquet").read_bytes()
    data = bytearray((run_dir / "beta.npy").read_bytes())
    data[-8:] = np.float64(-7.5).tobytes()
    (run_dir / "beta.npy").write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"beta.npy: not a readable .npy array \(its bytes are not those the run "
                                         r"wrote \(SHA-256"):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
    assert (run_dir / "scores.parquet").read_bytes() == scores_before
    status = run_status(run_dir)
    assert status.state == "damaged" and status.problems == [f"{run_dir / 'beta.npy'}: SHA-256 differs from the one "
                                                             "summary.json recorded"]
    (run_dir / "gram.npy").unlink()
    assert run_status(run_dir, quick=True).problems == [f"{run_dir / 'gram.npy'}: missing"]


def _summary_edit(change):
    def damage(run_dir):
        path = run_dir / "summary.json"
        summary = json.loads(path.read_text())
        change(summary)
        path.write_text(json.dumps(summary))
    return damage


def _scores_edit(change):
    def damage(run_dir):
        path = run_dir / "scores.parquet"
        pq.write_table(change(pq.read_table(path)), path)
    return damage


DAMAGED_RUN_FOLDERS = [
    (lambda d: (d / "summary.json").write_text("{oops"), r"summary.json: not readable JSON"),
    (lambda d: (d / "summary.json").write_text("[1, 2]"), r"summary.json: expected a JSON object, got list"),
    (_summary_edit(lambda s: s.pop("order")), r"summary.json: field `order` must list .* \(got null\)"),
    (_summary_edit(lambda s: s["order"].append(s["order"][0])), r"field `order` must list the run's candidate names, each once"),
    (_summary_edit(lambda s: s["order"].pop()), r"beta.npy: shape \(5,\), but summary.json's order lists 4 groups"),
    (_summary_edit(lambda s: s["config"]["select"].update(k=0)), r"field `config.select.k` must be an integer >= 1 \(got 0\)"),
    (_summary_edit(lambda s: s.update(finetune=[{}])), r"field `finetune` is malformed"),
    (_summary_edit(lambda s: s.update(finetune=[{"groups": ["a", "b"], "weights": {"a": 1.0}}])),
     r"field `finetune` is malformed"),
    (_summary_edit(lambda s: s.update(solver="x")), r"field `solver` is malformed"),
    (_summary_edit(lambda s: s.update(space="other")), r"field `space` is malformed"),
    (_summary_edit(lambda s: s.update(status="running")), r"summary.json: field `status` is \"running\": the run was stopped"),
    (lambda d: (d / "scores.parquet").unlink(), r"scores.parquet: missing"),
    (lambda d: (d / "scores.parquet").write_bytes(b"junk"), r"scores.parquet: not a readable Parquet file"),
    (_scores_edit(lambda t: t.drop_columns(["cosine"])), r"scores.parquet: missing column\(s\) \['cosine'\]"),
    (_scores_edit(lambda t: t.slice(1)), r"scores.parquet: its 4 rows do not match summary.json's order of 5 groups"),
]


@pytest.mark.parametrize("damage, message", DAMAGED_RUN_FOLDERS)
def test_resolve_refuses_a_damaged_summary_or_scores_table(first_run, tmp_path, damage, message):
    """Each damage is a clear StoreError naming the file and field, raised before anything is rewritten."""
    run_dir = tmp_path / "copy"
    own_copy(first_run, run_dir)
    damage(run_dir)
    before = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
    with pytest.raises(StoreError, match=message):
        resolve(run_dir, gamma=0.01, budget=None, method=None, normalize=None)
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()} == before


def test_a_stopped_re_solve_leaves_the_run_as_it_was_and_a_rerun_completes(first_run, tmp_path, monkeypatch):
    """A re-solve stopped after it wrote its scores (staged) leaves the run folder byte-identical and complete;
    `convalue solve` again writes the new solution whole."""
    from convalue.engine.store.record import RunRecord
    from convalue.engine.store.status import run_status

    _, data, _ = first_run
    run_dir = tmp_path / "copy"
    own_copy(first_run, run_dir)
    before = snapshot(run_dir)
    gamma = data["solver"]["gamma"] / 3
    write_parquet = RunRecord.write_parquet

    def stop_after_scores(self, name, table):
        write_parquet(self, name, table)
        raise KeyboardInterrupt  # stopped right after scores.parquet, before the swap

    monkeypatch.setattr(RunRecord, "write_parquet", stop_after_scores)
    with pytest.raises(KeyboardInterrupt):
        resolve(run_dir, gamma=gamma, budget=None, method=None, normalize=None)
    assert snapshot(run_dir) == before and run_status(run_dir).state == "complete"
    monkeypatch.setattr(RunRecord, "write_parquet", write_parquet)
    out = resolve(run_dir, gamma=gamma, budget=None, method=None, normalize=None)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert out.status == on_disk["status"] == "complete" and on_disk["solver"]["gamma"] == gamma
    assert run_status(run_dir).problems == []
    scores = {r["group"]: r["score"] for r in pq.read_table(run_dir / "scores.parquet").to_pylist()}
    assert [scores[n] for n in on_disk["order"]] == pytest.approx(
        solve_kmm(np.load(run_dir / "gram.npy"), np.load(run_dir / "beta.npy"), gamma=gamma,
                  normalize=on_disk["solver"]["normalize"]).w, abs=1e-9)


def test_gradient_space_run_matches_the_gram_space_solution_and_resolves(first_run):
    """solver.space: gradients reduces and writes no Gram (gram.npy); its scores equal the Gram-space solution, and it
    re-solves."""
    tmp, data, _ = first_run
    cfg = data | {"name": "gs", "finetune": {"enabled": False}, "solver": data["solver"] | {"space": "gradients"}}
    summary = run(config_from_dict(cfg))
    gs = tmp / "runs" / "gs"
    assert summary.status == "complete" and summary.space == "gradients" and not (gs / "gram.npy").exists()
    K, beta = np.load(tmp / "runs" / "t" / "gram.npy"), np.load(tmp / "runs" / "t" / "beta.npy")
    order = summary.order

    def scores(run_dir):
        rows = pq.read_table(run_dir / "scores.parquet").to_pylist()
        return np.array([{r["group"]: r["score"] for r in rows}[n] for n in order])

    expected = solve_kmm(K, beta, gamma=data["solver"]["gamma"], normalize="cosine").w
    np.testing.assert_allclose(scores(gs), expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(np.load(gs / "beta.npy"), beta, rtol=1e-6)
    resolve(gs, gamma=0.004, budget=None, method=None, normalize=None)
    np.testing.assert_allclose(scores(gs), solve_kmm(K, beta, gamma=0.004, normalize="cosine").w, rtol=1e-6,
                               atol=1e-9)
    with pytest.raises(ConfigError, match="method: .*needs the Gram \\(got 'cvxpy'\\)"):
        resolve(gs, gamma=0.004, budget=None, method="cvxpy", normalize=None)
    with pytest.raises(ValueError, match="space: gram"):
        config_from_dict(cfg | {"solver": cfg["solver"] | {"method": "cvxpy"}})
    # the stored vectors are read in the summary's metric: a damaged entry is refused, never read as Euclidean
    _summary_edit(lambda s: s["config"]["features"].update(metric="cosine"))(gs)
    with pytest.raises(StoreError, match="field `config.features.metric` is malformed"):
        resolve(gs, gamma=0.004, budget=None, method=None, normalize=None)
    (gs / "vectors" / "manifest.json").write_text("{oops")
    _summary_edit(lambda s: s["config"]["features"].update(metric="euclidean"))(gs)
    with pytest.raises(StoreError, match="manifest.json: not readable JSON"):
        resolve(gs, gamma=0.004, budget=None, method=None, normalize=None)
