"""Finished fine-tunes kept in the run folder (`finetunes/<key>.json`), keyed by a hash of everything that decides
their result, so a rerun (a wider finetune.ks, another baseline, a run resumed after a failure) trains only the
selections it has not trained before."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from convalue.engine.data.prepare import examples_digest
from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.store.artifacts import package_versions, write_json

log = logging.getLogger("convalue")

#: fine-tune settings that only choose which runs happen, not what a run gives
NOT_IN_KEY = ("enabled", "baselines", "ks", "repeats", "random_orders", "mixture", "mixture_temperature",
              "mixture_weights", "mixture_default_weight", "rho_by_k", "tune",
              "strategy", "model", "dtype", "deepspeed")  # how a job runs: in the settings below, each its own way  # the groups, weights and rho_k: per job
#: settings an SFT fine-tune does not read: left out of its key, so SFT keys are those of before `objective` existed
SFT_IGNORES = ("objective", "grpo_reward", "grpo_reward_signature", "grpo_reward_column", "grpo_generations",
               "grpo_max_new_tokens", "grpo_temperature", "grpo_top_p", "grpo_kl_coef")
#: budget `fixed` is left out of every key (keys of before `budget` existed), and so is `additive` where a run buys
#: nothing: the target-only run is the same fine-tune under both
FIXED_BUDGET = "fixed"
RESULT_FIELDS = {"label": str, "groups": list, "steps": int, "target_steps": int, "aux_steps": int,
                 "val_loss": float, "first_train_loss": float, "last_train_loss": float, "seconds": float}


def curve_is_valid(curve: Any) -> bool:
    """Whether a fine-tune record's `curve` is a list of {step: int, losses: {evaluation: number}}."""
    return isinstance(curve, list) and all(
        isinstance(p, dict) and isinstance(p.get("step"), int) and not isinstance(p["step"], bool)
        and isinstance(p.get("losses"), dict) and all(isinstance(n, str) and isinstance(v, (int, float))
                                                      for n, v in p["losses"].items()) for p in curve)


def job_settings(spec: ReplicaSpec) -> dict:
    """What a fine-tune's result depends on besides its data: model, LoRA, training settings, device, threads,
    and the versions of the packages that compute it. finetune.eval_every 0 (no learning curve) is left out, as
    budget `fixed` is: keys of before the curve existed stand; a curve's N is in its key, so a stored fine-tune
    without one (or with another N) never serves a run that asks for one."""
    versions = package_versions(("torch", "transformers", "peft"))
    return {"model": spec.model.source, "model_digest": spec.model_digest, "dtype": spec.model.dtype,
            "pad_id": spec.pad_id, "lora": asdict(spec.lora), "device": spec.device,
            "threads": spec.threads, "packages": versions,
            "finetune": {k: v for k, v in asdict(spec.finetune).items() if k not in NOT_IN_KEY
                         and not (spec.finetune.objective == "sft" and k in SFT_IGNORES)
                         and not (k == "budget" and v == FIXED_BUDGET)
                         and not (k == "eval_every" and not v)}}


def train_job_settings(ts: Any, spec: ReplicaSpec) -> dict:
    """job_settings for a DeepSpeed job (ts: engine.protocol.deepspeed.TrainJobSpec): the fine-tune model's content
    hash and dtype, the ZeRO settings and the DeepSpeed version beside the rest."""
    versions = package_versions(("torch", "transformers", "peft", "deepspeed"))
    return job_settings(spec) | {"model": spec.finetune.model or spec.model.source, "model_digest": ts.model_digest,
                                 "dtype": ts.dtype, "pad_id": None, "device": "cuda" if ts.zero.use_gpu else "cpu",
                                 "threads": ts.threads, "packages": versions, "zero": asdict(ts.zero)}


class FinetuneStore:
    """The fine-tunes of one run folder: get/put by key; a damaged entry is trained again, with a warning."""

    def __init__(self, root: RunFolder | Path, settings: dict, train: list[TokenizedExample],
                 val: list[TokenizedExample]):
        self.root = as_folder(root)
        self._base = {"settings": settings, "train": examples_digest(train), "val": examples_digest(val)}

    def job_key(self, aux: dict[str, list[TokenizedExample]], seed: int | None = None,
                weights: dict[str, float] | None = None, rho: float | None = None) -> str:
        """Key of a fine-tune on the target plus these auxiliary groups (names matter: they order the draws), under
        `seed` and `rho` (None: those of the settings), drawing the groups by `weights` (None: uniformly)."""
        settings, base = self._base["settings"], self._base
        own = {k: v for k, v in (("seed", seed), ("rho", rho)) if v is not None}
        if own or (not aux and "budget" in settings["finetune"]):
            finetune = {k: v for k, v in settings["finetune"].items() if aux or k != "budget"}
            base = base | {"settings": settings | {"finetune": finetune | own}}
        if weights is not None:
            base = base | {"weights": {n: weights[n] for n in sorted(weights)}}
        return self._hash(base | {"aux": {n: examples_digest(aux[n]) for n in sorted(aux)}})

    def base_key(self) -> str:
        """Key of the base model's validation loss."""
        s = self._base["settings"]
        return self._hash({"base": {k: s[k] for k in ("model", "model_digest", "dtype", "pad_id", "device", "packages")},
                           "eval_batch_size": s["finetune"]["eval_batch_size"], "val": self._base["val"]})

    @staticmethod
    def _hash(obj: dict) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, key: str, fields: dict[str, type] = RESULT_FIELDS) -> dict | None:
        """The stored record, or None when absent or not a well-formed record of these fields."""
        name = f"{key}.json"
        path = self.root / name
        if not self.root.is_file(name):
            return None
        try:
            record = json.loads(self.root.read_text(name))
            ok = isinstance(record, dict) and record.get("key") == key and all(
                isinstance(record.get(f), t) and not isinstance(record.get(f), bool)
                and (t is not float or math.isfinite(record[f])) for f, t in fields.items()) and (
                record.get("curve") is None or curve_is_valid(record["curve"]))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            ok = False
        if not ok:
            log.warning("%s: not a readable fine-tune record; that fine-tune is trained again", path)
            return None
        return {k: v for k, v in record.items() if k != "key"}

    def get_base(self) -> float | None:
        """The stored base-model validation loss, or None."""
        record = self.get(self.base_key(), {"base_val_loss": float})
        return None if record is None else record["base_val_loss"]

    def put(self, key: str, record: dict) -> None:
        """Store a record atomically (the run holds the folder's lock)."""
        write_json(record | {"key": key}, self.root, f"{key}.json")

    def put_base(self, loss: float) -> None:
        """Store the base-model validation loss."""
        self.put(self.base_key(), {"base_val_loss": loss})
