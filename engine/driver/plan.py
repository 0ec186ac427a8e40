"""`convalue run --dry-run`: what a run would do and cost, without starting Ray: the config checked, the model and
its LoRA targets checked, the groups resolved and their previews tokenised, the solve it would make, the fine-tunes
counted and what they are judged by, and the time estimated from the passes and loads measured on this machine."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from convalue.engine.config import RunConfig
from convalue.engine.config.sources import measure_parts
from convalue.engine.data.costs import load_costs
from convalue.engine.data.prepare import prepare
from convalue.engine.data.sources import load_source
from convalue.engine.driver import plan_timing
from convalue.engine.driver.baselines import FITTED
from convalue.engine.driver.checks import TAGS, check_budgets, check_projection, solver_space
from convalue.engine.driver.plan_timing import FinetuneEstimate, Timing
from convalue.engine.files.errors import StoreError
from convalue.engine.model.loading import check_lora_targets_in, load_tokenizer, resolve_model
from convalue.engine.protocol.evaluate import BASELINE_METHODS
from convalue.engine.store.record import run_folder_of


@dataclass(frozen=True)
class RunPlan:
    """The work a run would do, and its estimated cost."""

    run_dir: str  # where the outputs would go (a URI intact)
    model_dir: str
    target: str
    target_train: int
    target_val: int
    candidates: int
    clustered_pools: list[str]
    preview_tokens: int
    workers: int
    blocks: int
    space: str  # the solve's space as the run would choose it (solver.space, `auto` resolved for this pool)
    methods: list[str]
    ks: list[int]
    seeds: list[int]
    fine_tunes: int
    fine_tune_tokens: int
    val_tokens: int  # every evaluation's tokens (the target's validation split and data.eval's sets), per fine-tune
    evals: list[tuple[str, str, int]]  # data.eval's sets: (name, where from, examples)
    timing: Timing | None
    featurize_seconds: float | None
    finetune: FinetuneEstimate | None
    warnings: list[str]

    @property
    def tokens_per_second(self) -> float | None:
        """Featurisation's measured tokens per second per worker (None: not measured)."""
        return self.timing.tokens_per_second if self.timing else None

    @property
    def finetune_seconds(self) -> float | None:
        """The fine-tune stage's estimated wall time (None: not measured)."""
        return self.finetune.seconds if self.finetune else None


def run_dir_of(cfg: RunConfig) -> tuple[str, str | None]:
    """(the run folder as the run would name it, why its parent cannot be opened now or None)."""
    try:
        return str(run_folder_of(cfg.out, cfg.name)), None
    except StoreError as exc:  # an unreachable store: the run would fail there; the plan says so and goes on
        return f"{str(cfg.out).split('?', 1)[0].rstrip('/')}/{cfg.name}", f"out: {exc}"


def make_plan(cfg: RunConfig, measure: bool = True) -> RunPlan:
    """The plan of cfg (no Ray): a flat pool is counted, not embedded and clustered, so its groups are estimated."""
    run_dir, unreachable = run_dir_of(cfg)
    model_dir = resolve_model(cfg.model).dir
    tokenizer = load_tokenizer(model_dir)
    if cfg.features.parameters == "lora":
        check_lora_targets_in(model_dir, cfg.lora)
    check_projection(cfg, model_dir)
    pools = [s for s in cfg.data.candidates if s.clusters is not None]
    data_cfg = dataclasses.replace(cfg.data, candidates=[dataclasses.replace(s, clusters=None)
                                                         for s in cfg.data.candidates], small_groups="keep")
    data = prepare(data_cfg, tokenizer, cfg.model.max_length, grpo=cfg.features.representation == "grpo")
    lengths = [len(e) for it in [data.target_item, *data.items] for e in it.examples]
    mean_len = sum(lengths) / max(len(lengths), 1)
    n = (len(data.items) if not pools else
         sum(len(load_source(s)) for s in cfg.data.candidates if s.clusters is None) + sum(s.clusters for s in pools))
    check_budgets(cfg, n)  # a flat pool's n is its clusters' count: an upper bound
    if cfg.solver.costs_file and not pools:
        load_costs(cfg.solver.costs_file, data.names())
    preview = int(sum(lengths) if not pools else mean_len * (n + 1) * cfg.data.preview_size)
    reps = cfg.features.representations or [cfg.features.representation]
    rep_methods = [] if len(reps) < 2 else [TAGS[reps[0]]] + [m for r in reps[1:] for m in (TAGS[r], f"{TAGS[r]}+kmm")]
    fitted = [b for b in cfg.finetune.baselines if b in FITTED]
    methods = (["kmm"] + [b for b in cfg.finetune.baselines if b in BASELINE_METHODS] + rep_methods + fitted
               + (["kmm_path"] if cfg.solver.path else []))
    ks, seeds = cfg.evaluation_ks(), cfg.finetune.seeds()
    cells = (len(methods) * len(ks) + ("target_only" in cfg.finetune.baselines)) * len(seeds)
    dm = cfg.finetune.datamodel
    extra = sum(round(dm.runs_per_candidate * n) + 1 for b in fitted if b.startswith("datamodel"))
    extra += 1 if any(b.startswith("gradex") for b in fitted) else 0  # theta*
    tune = cfg.finetune.tune
    extra += len(methods) * len(ks) * tune.repeats * len(tune.rho) if tune.enabled else 0  # on seeds of its own
    fine_tunes = cells + extra if cfg.finetune.enabled else 0
    ft_tokens = int(fine_tunes * cfg.finetune.steps * cfg.finetune.batch_size * mean_len)
    evals = list(getattr(data, "evals", None) or [])  # data.eval's sets, where this version prepares them
    val_tokens = sum(len(e) for e in data.target_val) + sum(len(t) for e in evals for t in getattr(e, "tokens", ()))
    if "task_vector" in reps:  # a short fine-tune per group
        tv = cfg.features.tv_steps or max(1, round(cfg.features.tv_fraction * cfg.finetune.steps))
        preview += int((n + 1) * tv * cfg.features.tv_batch_size * mean_len)
    timing = estimate = None
    if measure:
        padded = plan_timing.expected_padded_length([len(e) for e in data.target_train],
                                        [[len(e) for e in it.examples] for it in data.items],
                                        cfg.finetune.batch_size, cfg.finetune.rho)
        timing = plan_timing.measure(model_dir, cfg, max(8, round(mean_len)), max(8, round(padded)))
        estimate = plan_timing.estimate_finetunes(timing, cfg, fine_tunes, val_tokens)
    workers = max(1, min(cfg.ray.workers, math.ceil(n / cfg.ray.groups_per_call)))
    feat_s = preview / (timing.tokens_per_second * workers) if timing else None
    return RunPlan(run_dir=run_dir, model_dir=str(model_dir), target=data.target.name,
                   target_train=len(data.target_train), target_val=len(data.target_val), candidates=n,
                   clustered_pools=[_stem(s) for s in pools], preview_tokens=preview, workers=workers,
                   blocks=math.ceil(n / cfg.ray.groups_per_call), space=solver_space(cfg, n), methods=methods, ks=ks,
                   seeds=seeds, fine_tunes=fine_tunes, fine_tune_tokens=ft_tokens, val_tokens=val_tokens,
                   evals=[(str(getattr(e, "name", "?")), str(getattr(e, "source", "")), len(getattr(e, "tokens", ())))
                          for e in evals],
                   timing=timing, featurize_seconds=feat_s, finetune=estimate,
                   warnings=([unreachable] if unreachable else []) + data.warnings)


def _stem(src) -> str:
    """The group-name prefix of a flat pool's clusters."""
    return Path(src.path).stem if src.path else src.kind


METHODS = {"auto": "convalue's exact active-set solver", "active_set": "convalue's exact active-set solver",
           "cvxpy": "the CVXPY + OSQP reference, tight tolerances", "cvxpy_paper": "CVXPY + OSQP as the paper calls it"}


def solve_line(cfg: RunConfig, plan: RunPlan) -> str:
    """The solve as the run would make it: form and gamma (absolute and relative), normalisation, space, method."""
    s = cfg.solver
    priced = " c_i" if s.costs_file else ""
    root = " sqrt(K_ii)" if s.normalize == "cosine" else ""
    gmax = f"gamma_max = max_i |beta_i| /{priced}{root}" if priced or root else "gamma_max = max_i |beta_i|"
    if s.budget is not None:
        form = f"budget form (||w||_1{' weighted by the prices' if priced else ''} <= {s.budget:g})"
    elif s.gamma_ratio is not None:
        form = (f"penalised form, gamma = {s.gamma_ratio:g} x {gmax} (relative; the absolute gamma is fixed once "
                "beta and K are formed, and recorded in summary.json's solver)")
    else:
        form = (f"penalised form, gamma = {s.gamma:g} (absolute; its share of {gmax}, the gamma that zeroes every "
                "score, is known only once beta and K are formed)")
    space = ("gram (K formed, gram.npy written)" if plan.space == "gram" else
             "gradients (K formed on the active set only; no gram.npy)")
    auto = f"auto for {plan.candidates} candidates: " if s.space == "auto" else ""
    extras = [f"prices from {s.costs_file}" if s.costs_file else None, f"tol {s.tol:g}" if s.tol else None,
              f"the regularisation path too ({s.path_points} points)" if s.path else None]
    return (f"solve: {form}; normalize {s.normalize}; space {auto}{space}; method {s.method} "
            f"({METHODS.get(s.method, s.method)})" + "".join(f"; {e}" for e in extras if e))


def _eval_sets(cfg: RunConfig, plan: RunPlan) -> str:
    """The evaluations: the target's validation split and data.eval's sets (as prepared, else as configured)."""
    sets = [f"target_val ({plan.target}'s {plan.target_val} validation examples)"]
    if plan.evals:
        sets += [f"{name} ({source + ', ' if source else ''}{n} examples)" for name, source, n in plan.evals]
    else:
        configured = getattr(cfg.data, "eval", None)  # data.eval, where this version has it
        if isinstance(configured, dict):
            sets += [f"{name} ({getattr(src, 'kind', '?')} {getattr(src, 'path', None) or ''}".rstrip() + ")"
                     for name, src in configured.items()]
        elif configured:
            sets.append(str(configured))
    return "; ".join(sets)


def evaluation_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    """What each fine-tune is measured on and by, what decides best k, and the verdict's rule, as configured."""
    ft = cfg.finetune
    if not ft.enabled:
        return ["evaluation: none (finetune.enabled is false: no fine-tune, no verdict)"]
    metrics = ", ".join(map(str, getattr(ft, "metrics", ["loss"])))
    select_by = str(getattr(ft, "select_by", "loss"))
    higher = measure_parts(select_by)[1] == "accuracy"
    lines = [f"evaluation: every fine-tune measured by {metrics} on {_eval_sets(cfg, plan)}; "
             f"select_by {select_by!r} decides best k, the Borda count and the verdict"]
    if "target_only" not in ft.baselines:
        lines.append("verdict: none (target_only is not among finetune.baselines: nothing to compare KMM's "
                     "selection with)")
        return lines
    seeds = len(plan.seeds)
    rule = ("one seed gives no interval (finetune.repeats >= 3 gives one)" if seeds < 2 else
            f"the paired 95% t-interval of the differences over the {seeds} seeds: wholly "
            f"{'above' if higher else 'below'} 0, KMM's selection beats the target alone; wholly "
            f"{'below' if higher else 'above'}, the target alone beats it; else no difference the seeds can resolve")
    lines.append(f"verdict: at each k, KMM's selection minus the target alone on {select_by}, seed by seed; {rule}")
    return lines


def format_plan(plan: RunPlan, cfg: RunConfig) -> str:
    """The plan as a few lines for a person."""
    def est(s: float | None) -> str:
        return "not measured" if s is None else f"about {s / 60:.1f} min" if s >= 90 else f"about {s:.0f} s"

    ft, t = plan.finetune, plan.timing
    ft_parts = (f" ({ft.rounds} round(s) of {ft.parallel} job(s) at once; a job about {ft.job_seconds:.0f} s: "
                f"loading the model {t.load_seconds:.1f} s, {cfg.finetune.steps} steps of {t.step_seconds:.2f} s, "
                f"the evaluation {plan.val_tokens / t.eval_tokens_per_second:.1f} s"
                + (f", again every {cfg.finetune.eval_every} steps (the learning curve)" if cfg.finetune.eval_every
                   else "") + "; a worker's imports "
                f"{t.import_seconds:.1f} s)" if ft and t and ft.rounds else "")
    lines = [f"plan for run {cfg.name!r} (nothing was started; outputs would go to {plan.run_dir})",
             f"model: {cfg.model.source} -> {plan.model_dir} (LoRA targets {cfg.lora.target_modules} found)",
             f"target: {plan.target} ({plan.target_train} train / {plan.target_val} validation examples)",
             f"candidates: {plan.candidates} groups" + (f" (flat pools {plan.clustered_pools} counted as their "
                                                         "clusters; embedding and k-means not run)"
                                                         if plan.clustered_pools else ""),
             f"featurise: {plan.preview_tokens:,} preview tokens ({cfg.features.representation}, projected to "
             f"p = {cfg.projection.dim}) on {plan.workers} worker(s) x {cfg.ray.cpus_per_worker} CPU, "
             f"{plan.blocks} blocks of {cfg.ray.groups_per_call}: {est(plan.featurize_seconds)}",
             solve_line(cfg, plan),
             f"fine-tunes: at most {plan.fine_tunes} ({len(plan.methods)} method(s) {plan.methods} x k in {plan.ks}"
             f"{' + target only' if 'target_only' in cfg.finetune.baselines else ''} x {len(plan.seeds)} seed(s), "
             "plus the fitted baselines' own" + (f" and rho_k's tuning over {cfg.finetune.tune.rho} on "
                                                 f"{cfg.finetune.tune.by}" if cfg.finetune.tune.enabled else "")
             + "; fewer where selections coincide), "
             f"{cfg.finetune.steps} steps each: {est(plan.finetune_seconds)}{ft_parts}",
             *evaluation_lines(cfg, plan)]
    if t is not None:
        lines.append(f"measured here: {t.tokens_per_second:,.0f} tokens/s per worker (one packed LoRA forward and "
                     f"backward), a fine-tune step of {cfg.finetune.batch_size} x {t.step_length} tokens, a model "
                     "load; estimates leave out Ray start-up and packing gains"
                     + ("; accuracy's greedy generation is not timed" if "accuracy" in cfg.finetune.metrics else "")
                     + ("; fine-tunes under DeepSpeed are timed as single-device jobs" if
                        cfg.finetune.strategy == "deepspeed" else ""))
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
