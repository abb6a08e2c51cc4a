"""λ, slacks and violations in Hugging Face ``Trainer`` logs through ``ConstraintCallback.on_log``.

Checked on a plain ``Trainer`` and a tiny Llama: each training log line (and its ``state.log_history`` entry)
carries the multipliers after that step's dual step, equal to the λ the constraint holds then; a sampled
readout's per-layer estimates are labelled ``f_sampled`` / ``g_sampled`` with their standard errors, an
exact readout's are not; and ``log_before_reporters`` lets a callback that Trainer runs before ours (as it
runs the ``report_to`` integrations) see the keys.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import (
    ACDCCallback,
    ConstraintCallback,
    log_before_reporters,
    primal_dual_optimizer,
)
from descentlab.readout import CausalLMReadout
from tiny_models import lm_rows, tiny_llama

STEPS, BATCH, LAYERS = 3, 4, 2


def _args(tmp_path) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=0.1,
        lr_scheduler_type="constant",
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )


class LambdaAfterStep(TrainerCallback):
    """λ of the constraint at every ``on_step_end`` (after the optimizer step and its dual step)."""

    def __init__(self, constraint) -> None:
        self.constraint, self.lambdas = constraint, []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        lam = self.constraint.multipliers
        self.lambdas.append((torch.cat(list(lam.values())) if isinstance(lam, dict) else lam).clone())


class Reporter(TrainerCallback):
    """Stands in for a ``report_to`` integration: copies each training log line when its turn comes."""

    def __init__(self) -> None:
        self.lines: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if logs and "loss" in logs:
            self.lines.append(dict(logs))


def _train_set(tmp_path, reorder: bool) -> tuple[Trainer, dl.ConstraintSet, LambdaAfterStep, Reporter]:
    model = tiny_llama(layers=LAYERS)
    cs = dl.ConstraintSet(
        [
            dl.Constraint("cap", 1, dual_lr=1.0),  # f_L <= 3.0: violated from the start (≈ ln 97 = 4.6)
            dl.Constraint("budget", 1, dual_lr=0.5, resilience=dl.Resilience(penalty=2.0)),
        ]
    )
    record, reporter = LambdaAfterStep(cs), Reporter()
    values = lambda m, batch, out: {"cap": out["loss"] - 3.0, "budget": out["loss"] - 4.0}  # noqa: E731
    trainer = Trainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=lm_rows(STEPS * BATCH),
        callbacks=[reporter, ConstraintCallback(cs, values=values), record],
        optimizer_cls_and_kwargs=primal_dual_optimizer(cs, torch.optim.SGD, lr=0.1),
    )
    if reorder:
        log_before_reporters(trainer)
    trainer.train()
    return trainer, cs, record, reporter


def test_lambda_and_slacks_are_in_every_training_log_line(tmp_path) -> None:
    trainer, cs, record, reporter = _train_set(tmp_path, reorder=False)
    lines = [h for h in trainer.state.log_history if "loss" in h]
    assert len(lines) == STEPS
    assert float(cs["cap"].multipliers) > 0
    for step, (line, lam) in enumerate(zip(lines, record.lambdas, strict=True)):
        assert line["constraints/lambda/cap/0"] == pytest.approx(float(lam[0]), rel=0, abs=1e-12), step
        assert line["constraints/lambda/budget/0"] == pytest.approx(float(lam[1]), rel=0, abs=1e-12), step
        assert {"constraints/g/cap/0", "constraints/u/budget/0"} <= set(line), sorted(line)
    assert lines[-1]["constraints/u/budget/0"] == pytest.approx(float(cs["budget"].slacks), abs=1e-12)
    # a callback Trainer runs before ours (as it runs report_to's integrations) saw none of the keys
    assert reporter.lines and not any(k.startswith("constraints/") for k in reporter.lines[-1])


def test_log_before_reporters_lets_the_integrations_see_lambda(tmp_path) -> None:
    trainer, cs, _, reporter = _train_set(tmp_path, reorder=True)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names.index("ConstraintCallback") < names.index("Reporter")
    assert names[0] == "DefaultFlowCallback"
    assert reporter.lines[-1]["constraints/lambda/cap/0"] == pytest.approx(float(cs["cap"].multipliers))


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "exact"])
def test_layerwise_descent_logs_say_when_the_readout_sampled(tmp_path, sampled) -> None:
    readout = CausalLMReadout(
        sample_tokens=8 if sampled else None, generator=torch.Generator().manual_seed(0)
    )
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.5, dual_lr=1.0)
    record = LambdaAfterStep(constraint)
    acdc = ACDCCallback(lambda m, o: dl.ACDC(m, o, sparsity=0.5, total_steps=STEPS))
    trainer = Trainer(
        model=tiny_llama(layers=LAYERS),
        args=_args(tmp_path),
        train_dataset=lm_rows(STEPS * BATCH),
        callbacks=[ConstraintCallback(constraint, readout=readout), acdc, record],
        optimizer_cls_and_kwargs=primal_dual_optimizer(constraint, torch.optim.SGD, lr=0.1),
    )
    trainer.train()
    line = [h for h in trainer.state.log_history if "loss" in h][-1]
    keys = set(line)
    lam = record.lambdas[-1]
    for layer in range(1, LAYERS + 1):
        assert line[f"descent/lambda/{layer}"] == pytest.approx(float(lam[layer - 1]), abs=1e-12)
    assert line["descent/lambda_max"] == pytest.approx(float(lam.max()), abs=1e-12) and float(lam.max()) > 0
    assert f"descent/f/{LAYERS}" in keys  # f_L is read on every token either way
    assert "sparsity/global" in keys
    if sampled:
        assert {f"descent/f_sampled/{i}" for i in range(LAYERS)} <= keys
        assert {f"descent/g_sampled/{i}" for i in range(1, LAYERS + 1)} <= keys
        assert all(line[f"descent/g_se/{i}"] > 0 for i in range(1, LAYERS + 1))
        assert line["descent/readout/sampled_k"] == 8 and line["descent/readout/n"] == BATCH * 9
        assert not any(k.startswith(("descent/f/0", "descent/g/")) for k in keys), sorted(keys)
    else:
        assert {f"descent/f/{i}" for i in range(LAYERS + 1)} <= keys
        assert {f"descent/g/{i}" for i in range(1, LAYERS + 1)} <= keys
        assert not any("sampled" in k or "g_se" in k for k in keys), sorted(keys)
