"""The evaluation protocol (paper Alg. 1, best-k and Borda) and the run's figures."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convalue.engine.config import ConfigError
from convalue.engine.protocol.evaluate import (
    borda_points,
    distinct_jobs,
    given_weights,
    label_of,
    method_scores,
    mix_runs,
    plan_runs,
    summarise,
)
from convalue.engine.protocol.finetune import mixing_schedule
from convalue.engine.report.plots import plot_evaluation, plot_scores
from convalue.engine.report.tables import evaluation_table, format_evaluation, scores_table
from convalue.engine.selection.select import select_top_k

NAMES = ["a", "b", "c", "d", "e"]


def test_each_method_buys_its_top_k_positive_groups():
    w = np.array([0.0, 0.3, -0.2, 0.3, 0.1])
    beta = np.array([0.5, 0.1, 0.4, 0.2, -0.3])
    scores = method_scores(["kmm", "alignment"], w, beta, cos=beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [1, 2, 4], target_only=True)
    got = {(r.method, r.k): r.groups for r in runs}
    assert got["kmm", 1] == ("d",)  # b and d tie on w; beta breaks the tie
    assert got["kmm", 2] == ("b", "d")
    assert got["kmm", 4] == ("b", "d", "e")  # only three positive scores: Alg. 1 buys fewer than k
    assert got["alignment", 4] == ("a", "b", "c", "d")
    assert runs[-1].method == "target_only" and runs[-1].groups == () and runs[-1].label == "target only"
    assert [r.method for r in runs[:3]] == ["kmm"] * 3
    assert runs[0].label == "target + KMM top-1"


def test_selection_does_not_depend_on_the_scores_units():
    """Positive means above 1e-9 of the largest |score|: scores in tiny units (small gradient norms make beta and
    KMM's w tiny) buy the same groups, and round-off at that relative level is not bought."""
    w = np.array([3e-1, 2e-1, 4e-11, -1e-1, 0.0])
    beta = np.ones(5)
    assert select_top_k(w, beta, 4) == [0, 1]
    for scale in (1e-12, 1.0, 1e12):
        assert select_top_k(w * scale, beta, 4) == [0, 1]
    assert select_top_k(np.zeros(3), np.ones(3), 2) == [] and select_top_k(np.array([1e-30]), np.ones(1), 1) == [0]


def test_identical_selections_share_one_fine_tune():
    w = np.array([0.2, 0.1, 0.0, 0.0, 0.0])
    beta = np.array([0.3, 0.2, 0.1, -0.1, -0.2])
    scores = method_scores(["kmm", "alignment"], w, beta, cos=beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [1, 2, 3], target_only=True)
    jobs, served_by = distinct_jobs(runs)
    # kmm@2 == kmm@3 == alignment@2 == {a, b}; kmm@1 == alignment@1 == {a}
    assert [j.groups for j in jobs] == [("a",), ("a", "b"), ("a", "b", "c"), ()]
    assert [jobs[i].groups for i in served_by] == [r.groups for r in runs]


def test_no_positive_score_buys_nothing_and_shares_the_target_only_run():
    w = np.zeros(5)
    runs = plan_runs(NAMES, {"kmm": w}, np.ones(5), [2], target_only=True)
    jobs, served_by = distinct_jobs(runs)
    assert runs[0].groups == () and len(jobs) == 1 and served_by == [0, 0]


def test_random_order_is_seeded_and_buys_k_groups():
    a = method_scores(["random"], np.zeros(5), np.zeros(5), np.zeros(5), seed=3)["random"]
    b = method_scores(["random"], np.zeros(5), np.zeros(5), np.zeros(5), seed=3)["random"]
    c = method_scores(["random"], np.zeros(5), np.zeros(5), np.zeros(5), seed=4)["random"]
    assert np.array_equal(a, b) and sorted(a) == [1, 2, 3, 4, 5] and not np.array_equal(a, c)
    runs = plan_runs(NAMES, {"random": a}, np.zeros(5), [1, 3, 5], target_only=False)
    assert [len(r.groups) for r in runs] == [1, 3, 5]
    assert set(runs[0].groups) < set(runs[1].groups)  # one order, nested budgets


def test_mixtures_weigh_the_bought_groups():
    """Paper App. (auxiliary weighting): proportional to the usable examples, a softmax of the method's own scores
    over the bought groups, or uniform (None); random's scores are an order, and equal weights are uniform."""
    w, beta = np.array([0.4, 0.2, 0.0, -0.1, 0.05]), np.array([0.3, 0.5, 0.1, -0.2, 0.2])
    scores = method_scores(["kmm", "alignment", "random"], w, beta, beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [1, 2], target_only=True)
    sizes = {"a": 30, "b": 10, "c": 5, "d": 5, "e": 20}
    assert mix_runs(runs, "uniform", scores, NAMES, sizes) == runs
    by = {(r.method, r.k): r for r in mix_runs(runs, "proportional", scores, NAMES, sizes)}
    assert by["kmm", 2].weight_map() == pytest.approx({"a": 0.75, "b": 0.25})
    assert by["kmm", 1].weights is None and by["target_only", None].weights is None  # one group, or none
    soft = {(r.method, r.k): r for r in mix_runs(runs, "softmax", scores, NAMES, sizes, temperature=0.1)}
    e = np.exp([4.0, 2.0])
    assert soft["kmm", 2].weight_map() == pytest.approx({"a": e[0] / e.sum(), "b": e[1] / e.sum()})
    e = np.exp([3.0, 5.0])  # alignment buys the same two groups by beta: other weights, another fine-tune
    assert soft["alignment", 2].weight_map() == pytest.approx({"a": e[0] / e.sum(), "b": e[1] / e.sum()})
    assert soft["random", 2].weights is None
    jobs, _ = distinct_jobs(list(soft.values()))
    assert len(jobs) == len({(r.groups, r.weights) for r in soft.values()}) > len({r.groups for r in soft.values()})
    equal = mix_runs(runs, "proportional", scores, NAMES, dict.fromkeys(NAMES, 8))
    assert equal == runs  # equal sizes: the uniform runs themselves
    with pytest.raises(ValueError, match="unknown mixture 'zipf'"):
        mix_runs(runs, "zipf", scores, NAMES, sizes)


def test_given_weights_are_normalised_over_each_runs_bought_groups():
    """mixture `given` (the paper's popularity weights): the user's weight per group, for every method alike
    (random too: the weights belong to the groups, not to a score), normalised over what the run bought."""
    w, beta = np.array([0.4, 0.2, 0.0, -0.1, 0.05]), np.array([0.3, 0.5, 0.1, -0.2, 0.2])
    scores = method_scores(["kmm", "random"], w, beta, beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [1, 2, 3], target_only=True)
    given = {"a": 2.0, "b": 1.0, "c": 1.5, "d": 0.8, "e": 1.0}
    for r in mix_runs(runs, "given", scores, NAMES, {}, given=given):
        if len(r.groups) < 2 or len({given[g] for g in r.groups}) == 1:
            assert r.weights is None  # one group, or equal weights: the uniform run
        else:
            total = sum(given[g] for g in r.groups)
            assert r.weight_map() == pytest.approx({g: given[g] / total for g in r.groups})
    by = {(r.method, r.k): r for r in mix_runs(runs, "given", scores, NAMES, {}, given=given)}
    assert by["kmm", 2].weight_map() == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    with pytest.raises(ValueError, match="needs the weights"):
        mix_runs(runs, "given", scores, NAMES, {})
    # the groups not named take the default weight: the same mapping, so the same runs
    assert given_weights({"a": 2.0, "c": 1.5, "d": 0.8}, NAMES, default=1.0) == given


def test_given_weights_must_name_exactly_the_candidates():
    assert given_weights(dict.fromkeys(NAMES, 1.0), NAMES) == dict.fromkeys(NAMES, 1.0)
    with pytest.raises(ConfigError, match="not candidates, e.g. \\['hindu'\\]") as err:
        given_weights(dict.fromkeys(NAMES, 1.0) | {"hindu": 2.0}, NAMES)
    assert err.value.field == "finetune.mixture_weights.hindu"
    with pytest.raises(ConfigError, match="1 have none, e.g. \\['e'\\]"):
        given_weights(dict.fromkeys(NAMES[:4], 1.0), NAMES)
    assert given_weights(dict.fromkeys(NAMES[:4], 1.0), NAMES, default=0.8)[NAMES[4]] == 0.8  # the rest: default
    with pytest.raises(ConfigError, match="not candidates"):  # a default does not excuse a typo
        given_weights({"hindu": 2.0}, NAMES, default=0.8)


def test_each_budget_trains_under_its_rho_k():
    """Alg. 1's rho_k: a run at k carries rho_at(k); the same groups under another rho are another fine-tune, and a
    run that buys nothing (every step a target step) stays the target-only fine-tune."""
    w = np.array([0.2, 0.1, 0.0, 0.0, 0.0])
    beta = np.array([0.3, 0.2, 0.1, -0.1, -0.2])
    scores = method_scores(["kmm"], w, beta, cos=beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [2, 3], target_only=True, rho_at={2: 0.25, 3: 0.75, None: 0.5}.get)
    assert [(r.k, r.groups, r.rho) for r in runs] == [(2, ("a", "b"), 0.25), (3, ("a", "b"), 0.75),
                                                      (None, (), None)]
    jobs, served_by = distinct_jobs(runs)
    assert len(jobs) == 3 and served_by == [0, 1, 2]  # kmm@2 and kmm@3 buy {a, b}, under other rho
    assert distinct_jobs(plan_runs(NAMES, scores, beta, [2, 3], True, rho_at=lambda k: 0.5))[1] == [0, 0, 1]
    none = plan_runs(NAMES, {"kmm": np.zeros(5)}, beta, [2], target_only=True, rho_at=lambda k: 0.9)
    assert none[0].rho is None and distinct_jobs(none)[1] == [0, 0]


def test_weighted_schedule_draws_groups_by_their_weights():
    plan = mixing_schedule(20000, 0.5, 3, seed=1, weights=[0.6, 0.3, 0.1])
    aux = np.array([s for s in plan if s >= 0])
    assert abs(len(aux) / len(plan) - 0.5) < 0.02
    assert np.bincount(aux, minlength=3) / len(aux) == pytest.approx([0.6, 0.3, 0.1], abs=0.02)
    assert mixing_schedule(50, 0.5, 3, seed=1) == mixing_schedule(50, 0.5, 3, seed=1, weights=None)
    assert set(mixing_schedule(200, 0.5, 3, seed=1, weights=[0.5, 0.5, 0.0])) == {-1, 0, 1}
    uniform = mixing_schedule(300, 0.5, 3, seed=4)  # the same seed: the same target steps under any mixture
    assert [s < 0 for s in mixing_schedule(300, 0.5, 3, seed=4, weights=[0.1, 0.1, 0.8])] == [s < 0 for s in uniform]


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown valuation method 'datamodel'"):
        method_scores(["datamodel"], np.zeros(2), np.zeros(2), np.zeros(2), seed=0)


@pytest.mark.parametrize(("method", "label"), [
    ("kmm", "KMM"), ("target_only", "target only"), ("cosine", "one-step cosine"), ("one_step", "One-Step"),
    ("one_step+kmm", "One-Step + KMM"), ("tv", "TV"), ("tv+kmm", "TV + KMM"), ("grpo+kmm", "GRPO + KMM"),
    ("datamodel", "datamodel"), ("odd+kmm+x", "odd+kmm+x")])
def test_methods_are_printed_as_the_paper_names_them(method, label):
    assert label_of(method) == label


def test_borda_reproduces_the_papers_thai_table():
    """Paper Table (GRPO, Thai): accuracies per k; Borda 6, 14, 11, 12, 7 (a loss is minus the accuracy)."""
    acc = {"one_step": [35.6, 32.8, 39.2, 34.8, 31.2], "one_step_kmm": [37.6, 37.6, 35.6, 41.6, 37.2],
           "tv": [36.8, 39.6, 37.6, 34.4, 34.8], "tv_kmm": [40.4, 38.0, 37.2, 37.2, 34.4],
           "random": [30.8, 34.8, 32.0, 38.4, 36.8]}
    ks = [1, 2, 3, 4, 5]
    rows = [{"method": m, "k": k, "val_loss": -a, "groups": []} for m, accs in acc.items() for k, a in zip(ks, accs)]
    ev = summarise(rows, ks)
    assert ev["borda"] == {"one_step": 6, "one_step_kmm": 14, "tv": 11, "tv_kmm": 12, "random": 7}
    assert {m: b["k"] for m, b in ev["best_k"].items()} == {"one_step": 3, "one_step_kmm": 4, "tv": 2,
                                                            "tv_kmm": 1, "random": 4}
    assert sum(r["best"] for r in rows) == 5


def test_ties_split_their_points():
    assert borda_points({"x": 1.0, "y": 1.0, "z": 2.0}) == {"x": 1.5, "y": 1.5, "z": 0.0}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.data())
def test_borda_hands_out_every_point_once(n_methods, n_ks, data):
    ks = list(range(1, n_ks + 1))
    losses = st.sampled_from([1.0, 1.5, 2.0, 2.5])  # few values: many ties
    rows = [{"method": f"m{i}", "k": k, "val_loss": data.draw(losses), "groups": []}
            for i in range(n_methods) for k in ks]
    ev = summarise(rows, ks)
    assert sum(ev["borda"].values()) == pytest.approx(n_ks * n_methods * (n_methods - 1) / 2)
    for m, best in ev["best_k"].items():
        mine = [r for r in rows if r["method"] == m]
        assert best["val_loss"] == min(r["val_loss"] for r in mine)
        assert best["k"] == min(r["k"] for r in mine if r["val_loss"] == best["val_loss"])


def _rows(seeds: tuple[int, ...] = (0,)) -> tuple[list[dict], dict]:
    """Protocol rows as the pipeline makes them: one per cell and seed (a seed shifts every loss by 0.01 * seed)."""
    w, beta = np.array([0.4, 0.2, 0.0, -0.1, 0.05]), np.array([0.3, 0.5, 0.1, -0.2, 0.2])
    scores = method_scores(["kmm", "alignment", "random"], w, beta, beta, seed=0)
    runs = plan_runs(NAMES, scores, beta, [1, 2], target_only=True)
    jobs, served_by = distinct_jobs(runs)
    trained = [{"label": j.label, "groups": list(j.groups), "steps": 6, "target_steps": 3 if j.groups else 6,
                "aux_steps": 3 if j.groups else 0, "val_loss": 2.0 + 0.1 * i, "base_val_loss": 3.0 if i == 0 else None,
                "first_train_loss": 3.0, "last_train_loss": 2.0, "seconds": 1.0} for i, j in enumerate(jobs)]
    rows = [trained[j] | {"label": r.label, "method": r.method, "k": r.k, "seed": s, "reused": j == 0 and s == 0,
                          "val_loss": trained[j]["val_loss"] + 0.01 * s, "aux_steps": trained[j]["aux_steps"] + s}
            for r, j in zip(runs, served_by) for s in seeds]
    return rows, summarise(rows, [1, 2])


def test_evaluation_table_and_text():
    rows, ev = _rows()
    table = evaluation_table(rows)
    assert table.column_names == ["method", "k", "seed", "label", "groups", "weights", "val_loss", "points", "best",
                                  "rho", "target_steps", "aux_steps", "reused"]
    assert table.column("weights").null_count == table.num_rows  # uniform draws
    assert table.num_rows == 7 and table.column("k").null_count == 1  # 3 methods x 2 budgets + target only
    assert table.column("groups").to_pylist()[0] == ["a"]
    text = format_evaluation(rows, ev)
    assert "KMM" in text and "random" in text and "Borda" in text and "target only" in text
    assert "base model (theta_0)" in text and "3.0000" in text
    assert "target + KMM top-1: a (3/3)  stored" in text  # a fine-tune an earlier run trained
    assert format_evaluation([], None) == "fine-tune: disabled"
    rows[1]["weights"] = {"a": 0.75, "b": 0.25}  # KMM top-2 drawn by mixture weights
    text = format_evaluation(rows, ev)
    assert "what each run bought and mixture weights" in text and "target + KMM top-2: a 0.75, b 0.25 (3/3)" in text
    assert evaluation_table(rows).column("weights").to_pylist()[:2] == [None, [0.75, 0.25]]
    assert "rho" not in text  # one rho for every run: not repeated on each line
    for r in rows:  # finetune.rho_by_k {1: 0.75}: each run's rho_k is printed and kept
        r["rho"] = 1.0 if not r["groups"] else 0.75 if r["k"] == 1 else 0.5
    text = format_evaluation(rows, ev)
    assert "(rho_k; target steps" in text and "target + KMM top-1: a (rho 0.75; 3/3)" in text
    assert "target only: - (6/0)" in text
    assert evaluation_table(rows).column("rho").to_pylist()[:2] == [0.75, 0.5]


def test_several_seeds_are_summarised_by_their_means():
    """Paper App. (multi-seed results): each cell's mean and sample sd over its seeds; best k and Borda on the
    means; the text gives mean ± sd and each seed's steps; the table one row per seed."""
    rows, ev = _rows(seeds=(0, 1, 2))
    one, ev1 = _rows()
    assert ev["seeds"] == [0, 1, 2] and ev1["seeds"] == [0]
    assert ev["borda"] == ev1["borda"]  # every loss shifted alike: the same order at every k
    for m, best in ev["best_k"].items():
        assert best["k"] == ev1["best_k"][m]["k"] and best["groups"] == ev1["best_k"][m]["groups"]
        assert best["val_loss"] == pytest.approx(ev1["best_k"][m]["val_loss"] + 0.01)  # the mean of +0, +0.01, +0.02
        assert best["val_loss_sd"] == pytest.approx(0.01) and ev1["best_k"][m]["val_loss_sd"] is None
    assert ev["target_only_val_loss_sd"] == pytest.approx(0.01) and ev1["target_only_val_loss_sd"] is None
    assert [r["best"] for r in rows] == [r["best"] for r in one for _ in range(3)]  # a cell's flags on each seed
    assert evaluation_table(rows).num_rows == 3 * 7 and evaluation_table(rows).column("seed").to_pylist()[:3] == [0, 1, 2]
    text = format_evaluation(rows, ev)
    assert "mean ± sd over seeds [0, 1, 2]" in text and "±0.0100" in text
    assert "target + KMM top-1: a (3/3, 3/4, 3/5)  stored: 1 of 3" in text  # per seed; seed 0 trained earlier
    assert "±" not in format_evaluation(one, ev1)
    # KMM against each method seed by seed: every seed shifts both alike, so the pairs do not spread at all
    losses = {(r["method"], r["k"]): r["val_loss"] for r in one}
    assert [(d["method"], d["k"]) for d in ev["kmm_minus"]] == [
        (m, k) for m in ("alignment", "random", "target_only") for k in (1, 2)]
    for d in ev["kmm_minus"]:
        diff = losses["kmm", d["k"]] - losses[d["method"], None if d["method"] == "target_only" else d["k"]]
        assert d["mean"] == pytest.approx(diff) and d["sd"] == pytest.approx(0.0, abs=1e-12) and d["seeds"] == 3
        assert d["reference_lower"] == (3 if diff < -1e-9 else 0)
    assert ("  alignment: k=1 -0.2000±0.0000 [95% CI -0.2000, -0.2000] (KMM lower in 3 of 3), k=2 +0.0000±0.0000 "
            "[95% CI +0.0000, +0.0000] (KMM lower in 0 of 3)") in text
    assert all(d["ci95"] is None for d in ev1["kmm_minus"])  # one seed: no interval


def test_a_selection_that_differs_by_seed_is_printed_seed_by_seed():
    """finetune.random_orders per_seed: random's runs buy other groups under each seed; the list says which."""
    rows, ev = _rows(seeds=(0, 1))
    for r in rows:
        if r["method"] == "random" and r["k"] == 1 and r["seed"] == 1:
            r["groups"] = ["d"]
    text = format_evaluation(rows, ev)
    random1 = next(r for r in rows if (r["method"], r["k"], r["seed"]) == ("random", 1, 0))
    assert f"target + random top-1 (seed 0): {', '.join(random1['groups'])} (3/3)" in text
    assert "target + random top-1 (seed 1): d (3/4)" in text
    assert "target + KMM top-1: a (3/3, 3/4)  stored: 1 of 2" in text  # the same groups under both: one line


def test_paired_interval_is_scipys_paired_t_interval():
    """kmm_minus's ci95 is the paired t-test's 95 % confidence interval (scipy.stats.ttest_rel), seed by seed."""
    from scipy.stats import ttest_rel

    kmm, other = [2.91, 2.89, 2.93, 2.90, 2.92], [2.93, 2.90, 2.96, 2.94, 2.94]
    rows = [{"method": m, "k": 1, "seed": s, "val_loss": v, "groups": []}
            for m, losses in (("kmm", kmm), ("alignment", other)) for s, v in enumerate(losses)]
    (d,) = summarise(rows, [1])["kmm_minus"]
    ci = ttest_rel(kmm, other).confidence_interval(0.95)
    assert d["ci95"] == pytest.approx([ci.low, ci.high]) and d["ci95"][1] < 0  # KMM lower at the 5 % level


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(2, 4), st.data())
def test_borda_and_best_k_over_seeds_are_those_of_the_cell_means(n_methods, n_ks, n_seeds, data):
    ks = list(range(1, n_ks + 1))
    loss = st.sampled_from([1.0, 1.25, 1.5, 2.0])
    rows = [{"method": f"m{i}", "k": k, "seed": s, "val_loss": data.draw(loss), "groups": []}
            for i in range(n_methods) for k in ks for s in range(n_seeds)]
    cells = {(r["method"], r["k"]): [] for r in rows}
    for r in rows:
        cells[r["method"], r["k"]].append(r["val_loss"])
    means = [{"method": m, "k": k, "val_loss": sum(v) / len(v), "groups": []} for (m, k), v in cells.items()]
    ev, ev_means = summarise(rows, ks), summarise(means, ks)
    assert ev["borda"] == pytest.approx(ev_means["borda"])
    assert {m: b["k"] for m, b in ev["best_k"].items()} == {m: b["k"] for m, b in ev_means["best_k"].items()}
    rows_kmm = [r | {"method": "kmm" if r["method"] == "m0" else r["method"]} for r in rows]
    mean = {(m, k): sum(v) / len(v) for (m, k), v in cells.items()}
    for d in summarise(rows_kmm, ks)["kmm_minus"]:  # a mean of differences is the difference of the means
        assert d["mean"] == pytest.approx(mean["m0", d["k"]] - mean[d["method"], d["k"]])
        assert d["seeds"] == n_seeds and 0 <= d["reference_lower"] <= n_seeds


def test_figures_are_drawn_as_pngs():
    import io

    import matplotlib.image

    rows, ev = _rows()
    beta = np.linspace(1, -1, 60)
    w = np.where(np.arange(60) % 3 == 0, beta, 0.0)
    table = scores_table([f"g{i}" for i in range(60)], [8] * 60, [4] * 60, w, beta, beta, [0, 3])
    assert isinstance(table, pa.Table)
    figures = [plot_scores(table), plot_evaluation(rows, ev), plot_evaluation(*_rows(seeds=(0, 1)))]  # sd bars
    for png in figures:
        image = matplotlib.image.imread(io.BytesIO(png), format="png")
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0  # a drawn figure, not blank
    nothing = scores_table(["a", "b"], [8, 8], [4, 4], np.zeros(2), np.ones(2), np.ones(2), [])
    png = plot_scores(nothing)  # gamma above max|beta|: every score 0, an empty chart
    assert matplotlib.image.imread(io.BytesIO(png), format="png").shape[0] > 50


def _verdict_rows(kmm: list[float], target: list[float]) -> list[dict]:
    """kmm at k = 1 and target only, one row per seed, with the given validation losses."""
    base = {"steps": 24, "groups": [], "label": "", "target_steps": 12, "aux_steps": 12}
    return ([base | {"method": "kmm", "k": 1, "seed": s, "val_loss": v, "groups": ["a"]} for s, v in enumerate(kmm)]
            + [base | {"method": "target_only", "k": None, "seed": s, "val_loss": v} for s, v in enumerate(target)])


@pytest.mark.parametrize("kmm, target, word", [
    ([2.80, 2.81, 2.79], [2.90, 2.92, 2.91], "KMM's selection beats the target alone"),
    ([2.95, 2.96, 2.94], [2.90, 2.92, 2.91], "the target alone beats KMM's selection"),
    ([2.90, 2.93, 2.90], [2.91, 2.91, 2.92], "no difference the seeds can resolve"),
    ([2.80], [2.90], "one seed gives no interval"),
])
def test_the_verdict_states_the_regime_and_reads_the_paired_interval(kmm, target, word):
    from convalue.engine.report.tables import format_verdict

    rows = _verdict_rows(kmm, target)
    ev = summarise(rows, [1])
    text = format_verdict(rows, ev, 35)
    assert text.startswith(f"regime: a target of 35 train examples, 24 steps, {len(kmm)} seed(s)")
    mean = np.mean(np.subtract(kmm, target))
    assert f"k=1 {mean:+.4f}" in text and word in text
    assert ("95% CI" in text) == (len(kmm) > 1)
    assert format_verdict([], None, 35).startswith("verdict: not evaluated — no fine-tune ran")
    assert text.splitlines()[-1].startswith("verdict: ")  # the run's one verdict, after the regime


def test_the_printed_table_follows_the_selection_metric_and_shows_the_other():
    """select_by accuracy: the first table is accuracy (higher is better) with its Borda, then the loss table with
    its own; the cells are each metric's means."""
    rows = [r | {"val_accuracy": a} for r, a in zip(_verdict_rows([2.95, 2.96, 2.94], [2.90, 2.92, 2.91]),
                                                    [0.50, 0.40, 0.60, 0.30, 0.20, 0.25])]
    ev = summarise(rows, [1], "accuracy")
    ev["by_loss"] = {k: v for k, v in summarise([dict(r) for r in rows], [1], "loss").items()
                     if k in ("best_k", "borda", "kmm_minus")}
    text = format_evaluation(rows, ev)
    acc, loss = text.index("target validation accuracy"), text.index("target validation loss")
    assert acc < loss and "(higher is better" in text[acc:loss] and "(lower is better" in text[loss:]
    assert "0.5000±0.1000" in text[acc:loss] and "2.9500±0.0100" in text[loss:]
    assert "KMM's accuracy minus" in text and "KMM's loss minus" in text
