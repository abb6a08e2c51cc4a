"""DescentTrainer evaluation: per-layer eval losses, violations and which constraints hold, over the eval set."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainingArguments

import descentlab as dl
from descentlab.constrained.descent import descent_violations
from descentlab.errors import ConfigError
from descentlab.integrations.hf import DescentTrainer
from descentlab.readout import layer_losses
from tiny_models import tiny_bert, tiny_gpt2


def _examples(n: int, seed: int, *, labels: bool = True, vocab: int = 97) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (12,), generator=g)
        row = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if labels:
            row["labels"] = torch.tensor(int((ids < vocab // 2).sum() > 6))
        out.append(row)
    return out


def _args(out, **kw) -> TrainingArguments:
    base = {
        "output_dir": str(out),
        "max_steps": 4,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 6,
        "learning_rate": 1e-2,
        "report_to": [],
        "seed": 0,
        "use_cpu": True,
        "disable_tqdm": True,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
    }
    return TrainingArguments(**{**base, **kw})


def test_evaluate_logs_layer_losses_violations_and_met_constraints(tmp_path) -> None:
    model = tiny_bert(layers=3)
    constraint = dl.LayerwiseDescent(num_layers=3, alpha=[0.05, 0.0, 0.1], dual_lr=0.5, layers=[2, 3])
    eval_set = _examples(18, seed=1)  # 3 batches of 6
    trainer = DescentTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=_examples(32, 0),
        eval_dataset=eval_set,
        constraint=constraint,
    )
    trainer.train()
    lam = constraint.multipliers.clone()
    metrics = trainer.evaluate()
    assert torch.equal(constraint.multipliers, lam), "evaluation moved λ"

    # f_l over the whole eval set, independently: example-weighted mean of the batch means
    model.eval()
    batches = [{k: torch.stack([e[k] for e in eval_set[i : i + 6]]) for k in eval_set[0]} for i in (0, 6, 12)]
    with torch.no_grad():
        f = torch.stack([layer_losses(model, b) for b in batches]).double().mean(0)
        own = torch.stack([model(**b).loss for b in batches]).double().mean()
    for i in range(4):
        assert metrics[f"eval_layer_loss/{i}"] == pytest.approx(float(f[i]), abs=1e-6)
    assert metrics["eval_layer_loss/3"] == pytest.approx(metrics["eval_loss"], abs=1e-6)
    assert metrics["eval_loss"] == pytest.approx(float(own), abs=1e-6)

    g = descent_violations(f, torch.tensor([0.05, 0.0, 0.1], dtype=torch.float64))
    for layer in (1, 2, 3):
        assert metrics[f"eval_violation/{layer}"] == pytest.approx(float(g[layer - 1]), abs=1e-6)
    assert "eval_constraint_met/1" not in metrics  # layer 1 is not constrained
    met = [float(g[layer - 1] <= 0) for layer in (2, 3)]
    assert [metrics["eval_constraint_met/2"], metrics["eval_constraint_met/3"]] == met
    assert metrics["eval_constraints_met"] == pytest.approx(sum(met) / 2)
    # and they went through Trainer's log
    logged = [e for e in trainer.state.log_history if "eval_loss" in e][-1]
    assert logged["eval_violation/3"] == metrics["eval_violation/3"]
    assert not any(k.startswith("descent/") for k in logged)


def test_eval_layers_for_a_causal_lm_with_compute_metrics_and_without_constraint(tmp_path) -> None:
    model = tiny_gpt2(layers=2, vocab=50)
    eval_set = [dict(e, labels=e["input_ids"]) for e in _examples(8, seed=2, labels=False, vocab=50)]
    seen = []
    trainer = DescentTrainer(
        model=model,
        args=_args(tmp_path, per_device_eval_batch_size=4),
        eval_dataset=eval_set,
        eval_layers=True,
        compute_metrics=lambda p: seen.append(p) or {"n": float(len(p.predictions))},
    )
    metrics = trainer.evaluate()
    assert seen and metrics["eval_n"] == 8  # logits still reach compute_metrics
    model.eval()
    with torch.no_grad():
        own = [
            model(**{k: torch.stack([e[k] for e in eval_set[i : i + 4]]) for k in eval_set[0]}).loss
            for i in (0, 4)
        ]
    # the model's own loss (Trainer's eval_loss may differ for an LM: transformers 5.x counts unshifted labels
    # in num_items_in_batch when model.loss_type is None)
    assert metrics["eval_layer_loss/2"] == pytest.approx(float(sum(own) / 2), abs=1e-5)
    assert "eval_layer_loss/0" in metrics and not any(k.startswith("eval_violation") for k in metrics)

    plain = DescentTrainer(model=model, args=_args(tmp_path / "plain"), eval_dataset=eval_set)
    assert not any(k.startswith("eval_layer_loss") for k in plain.evaluate())  # off without a constraint


def test_a_constrained_causal_lm_evaluates_the_final_constraint_by_default(tmp_path) -> None:
    """With a constraint, evaluation reads what ERM reads plus the final constraint's check (layers L-1 and
    L: two head passes); every layer only when asked (eval_layers="all")."""
    from descentlab.readout import CausalLMReadout

    model = tiny_gpt2(layers=3, vocab=50)
    eval_set = [dict(e, labels=e["input_ids"]) for e in _examples(8, seed=2, labels=False, vocab=50)]
    constraint = dl.LayerwiseDescent(num_layers=3, alpha=0.05, dual_lr=0.1)
    heads: list[int] = []
    original = CausalLMReadout.__call__

    def counting(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        heads.append(int(torch.isfinite(out).sum()))
        return out

    args = _args(tmp_path, per_device_eval_batch_size=4)
    try:
        CausalLMReadout.__call__ = counting
        default = DescentTrainer(model=model, args=args, eval_dataset=eval_set, constraint=constraint)
        metrics = default.evaluate()
        assert heads and set(heads) == {2}  # f_{L-1} and f_L only, on every eval batch
        heads.clear()
        every = DescentTrainer(
            model=model, args=args, eval_dataset=eval_set, constraint=constraint, eval_layers="all"
        ).evaluate()
        assert set(heads) == {4}
    finally:
        CausalLMReadout.__call__ = original
    assert sorted(k for k in metrics if k.startswith("eval_layer_loss")) == [
        "eval_layer_loss/2",
        "eval_layer_loss/3",
    ]
    assert [k for k in metrics if k.startswith("eval_violation")] == ["eval_violation/3"]
    assert metrics["eval_constraints_met"] == metrics["eval_constraint_met/3"]
    for key in ("eval_layer_loss/2", "eval_layer_loss/3", "eval_violation/3"):
        assert metrics[key] == pytest.approx(every[key], abs=1e-6)  # the same numbers as the full read
    assert "eval_violation/1" in every and "eval_constraint_met/1" in every
    with pytest.raises(ConfigError, match="eval_layers"):
        DescentTrainer(model=model, args=args, eval_dataset=eval_set, eval_layers="some")
