"""`convalue run --dry-run`'s plan: the solve it would make (gamma, normalisation, form, space, method), the
evaluation and the verdict's rule, the run folder of a URI `out` intact, and a fine-tune estimate that counts the
model load each job pays. A tiny real Llama and real data files; no Ray."""

from __future__ import annotations

import math

import pytest
from conftest import chatterbot_pairs, tiny_run_config, write_jsonl

from convalue.engine.config import config_from_dict
from convalue.engine.driver.plan import format_plan, make_plan, solve_line
from convalue.engine.driver.plan_timing import Timing, estimate_finetunes, expected_padded_length

#: an S3 `out` that pyarrow opens without reaching a server (region and endpoint given)
S3_OUT = "s3://bucket/runs?region=us-east-1&endpoint_override=127.0.0.1:9"


def _cfg(tmp_path, model_dir, target, pool, **over):
    return config_from_dict(tiny_run_config(tmp_path, model_dir, target, pool, **over))


def test_the_plan_shows_the_solve_the_evaluation_the_verdict_and_the_estimate(tiny_model_dir, target_jsonl,
                                                                               pool_jsonl, tmp_path):
    cfg = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, out=S3_OUT,
               solver={"gamma": 0.1, "normalize": "cosine"},
               finetune={"enabled": True, "steps": 3, "batch_size": 2, "ks": [1, 2], "repeats": 3,
                         "baselines": ["target_only", "alignment"]}, ray={"workers": 2})
    plan = make_plan(cfg)
    text = format_plan(plan, cfg)
    lines = {line.split(":", 1)[0]: line for line in text.splitlines()}
    # the run folder of a URI `out`: the scheme's two slashes kept, the query left out
    assert "outputs would go to s3://bucket/runs/t)" in lines["plan for run 't' (nothing was started; outputs would go to s3"]
    assert plan.run_dir == "s3://bucket/runs/t"
    solve = lines["solve"]
    assert "penalised form, gamma = 0.1 (absolute;" in solve and "max_i |beta_i| / sqrt(K_ii)" in solve
    assert "normalize cosine; space auto for 4 candidates: gram (K formed" in solve
    assert "method auto (convalue's exact active-set solver)" in solve
    assert f"target_val (marathi's {plan.target_val} validation examples)" in lines["evaluation"]
    assert "select_by 'loss' decides best k" in lines["evaluation"]
    assert "paired 95% t-interval of the differences over the 3 seeds: wholly below 0" in lines["verdict"]
    # the estimate: 3 x (2 methods x 2 k + target only) = 15 jobs on 2 workers, each paying a model load
    t, ft = plan.timing, plan.finetune
    assert plan.fine_tunes == 15 and ft.parallel == 2 and ft.rounds == 8
    assert t.load_seconds > 0 and t.step_seconds > 0 and t.eval_tokens_per_second > 0
    val_s = plan.val_tokens / t.eval_tokens_per_second
    assert math.isclose(ft.job_seconds, t.load_seconds + 3 * t.step_seconds + val_s)
    assert math.isclose(ft.seconds, t.import_seconds + 8 * ft.job_seconds + val_s)
    assert f"loading the model {t.load_seconds:.1f} s" in lines["fine-tunes"]
    assert "8 round(s) of 2 job(s) at once" in lines["fine-tunes"]


def test_the_solve_line_names_each_form_as_configured(tiny_model_dir, target_jsonl, pool_jsonl, tmp_path):
    cfg = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
               solver={"gamma": None, "gamma_ratio": 0.05, "normalize": "none", "space": "gradients"})
    plan = make_plan(cfg, measure=False)
    solve = solve_line(cfg, plan)
    assert "penalised form, gamma = 0.05 x gamma_max = max_i |beta_i| (relative;" in solve
    assert "normalize none; space gradients (K formed on the active set only" in solve
    assert plan.timing is None and "not measured" in format_plan(plan, cfg)
    assert "evaluation: none (finetune.enabled is false" in format_plan(plan, cfg)
    budget = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                  solver={"gamma": None, "budget": 1.5, "method": "active_set"})
    solve = solve_line(budget, make_plan(budget, measure=False))
    assert "budget form (||w||_1 <= 1.5)" in solve and "method active_set" in solve


def test_an_unreachable_store_is_named_intact_with_a_warning(tiny_model_dir, target_jsonl, pool_jsonl, tmp_path):
    cfg = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, out="nosuchscheme://bucket/runs")
    plan = make_plan(cfg, measure=False)
    assert plan.run_dir == "nosuchscheme://bucket/runs/t"
    assert any(w.startswith("out: nosuchscheme://bucket/runs: not a filesystem URI") for w in plan.warnings)


def test_the_estimate_counts_rounds_loads_steps_and_evaluations(tiny_model_dir, target_jsonl, pool_jsonl, tmp_path):
    cfg = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
               finetune={"enabled": True, "steps": 10, "batch_size": 2}, ray={"workers": 2})
    t = Timing(tokens_per_second=100.0, import_seconds=5.0, load_seconds=2.0, step_seconds=0.5,
               eval_tokens_per_second=1000.0, step_length=40)
    est = estimate_finetunes(t, cfg, fine_tunes=5, val_tokens=3000)
    assert (est.parallel, est.rounds) == (2, 3)
    assert est.job_seconds == pytest.approx(2.0 + 10 * 0.5 + 3.0)
    assert est.seconds == pytest.approx(5.0 + 3 * 10.0 + 3.0)  # imports, 3 rounds, the base model's evaluation
    assert estimate_finetunes(t, cfg, fine_tunes=0, val_tokens=3000).seconds == 0.0
    curved = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, ray={"workers": 2},
                  finetune={"enabled": True, "steps": 10, "batch_size": 2, "eval_every": 4})
    # a curve's points at steps 4 and 8, the end's evaluation as before
    assert estimate_finetunes(t, curved, fine_tunes=5, val_tokens=3000).job_seconds == pytest.approx(
        2.0 + 10 * 0.5 + 3 * 3.0)


def test_the_padded_length_is_the_expected_longest_of_a_batch():
    assert expected_padded_length([50] * 10, [[20] * 5, [30] * 5], batch=4, rho=0.5) == pytest.approx(37.5)
    assert expected_padded_length([10, 20, 30], [], batch=3, rho=0.5) == pytest.approx(30.0)
    one = expected_padded_length([10, 20, 30, 40], [[100]], batch=1, rho=1.0)
    assert 20 <= one <= 30  # a batch of one: the mean length


def test_the_plan_counts_rho_k_tuning_on_its_own_seeds(tiny_model_dir, target_jsonl, pool_jsonl, tmp_path):
    held = write_jsonl(tmp_path / "held.jsonl", chatterbot_pairs("hindi", 8))
    finetune = {"enabled": True, "steps": 3, "batch_size": 2, "ks": [1, 2], "repeats": 3,
                "baselines": ["target_only", "alignment"], "select_by": "held:loss"}
    plain = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl, finetune=finetune,
                 data={"eval": {"held": {"kind": "jsonl", "path": str(held)}}})
    tuned = _cfg(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                 finetune=finetune | {"tune": {"rho": [0.25, 0.5, 0.75], "repeats": 2}},
                 data={"eval": {"held": {"kind": "jsonl", "path": str(held)}}})
    base = make_plan(plain, measure=False)
    plan = make_plan(tuned, measure=False)
    assert base.fine_tunes == 15 and plan.fine_tunes == 15 + 2 * 2 * 2 * 3  # methods x k x seeds x ratios
    assert "rho_k's tuning over [0.25, 0.5, 0.75] on target_val:loss" in format_plan(plan, tuned)
