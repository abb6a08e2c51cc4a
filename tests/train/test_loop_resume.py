"""The loop resumes exactly: interrupted + resumed == uninterrupted, bit for bit on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.errors import DataError, NumericalError
from descentlab.train.loop import TrainConfig, epoch_order, fit, global_batches, rank_share
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir


def _data(n: int = 70) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=gen)
    y = (x[:, :2].sum(1) > 0).long()
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 2)
    )  # dropout: RNG matters


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


class _Crash(Exception):
    pass


def _train(run: RunDir | None, *, crash_at: int | None = None, cfg: TrainConfig | None = None) -> nn.Module:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    cfg = cfg or TrainConfig(epochs=3, batch_size=16, checkpoint_every=4, progress=False, log_every=1)

    def crash(step: int, model: nn.Module, logs: dict) -> None:
        if crash_at is not None and step == crash_at:
            raise _Crash

    fit(
        model,
        _data(),
        objective=ERM(_loss),
        optimizer=opt,
        scheduler=sched,
        cfg=cfg,
        run=run,
        tag="t",
        callbacks=[crash],
    )
    return model


def test_resume_matches_uninterrupted_run(tmp_path) -> None:
    reference = _train(None)
    run = RunDir.create(tmp_path, "resume")
    with pytest.raises(_Crash):
        _train(run, crash_at=10)  # 5 steps per epoch: last checkpoint at step 8, mid-epoch 2
    resumed = _train(run)
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    steps = [r["step"] for r in run.metrics() if r.get("tag") == "t"]
    assert steps[:10] == list(range(1, 11)) and steps[10:] == list(range(9, 16))


def test_finished_job_is_not_retrained(tmp_path) -> None:
    run = RunDir.create(tmp_path, "done")
    first = _train(run)
    again = _train(run)  # loads the final checkpoint and takes no step
    assert all(
        torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True)
    )


def test_epoch_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    order = epoch_order(50, seed=2, epoch=1)
    assert sorted(order.tolist()) == list(range(50))
    assert torch.equal(order, epoch_order(50, seed=2, epoch=1))
    assert not torch.equal(order, epoch_order(50, seed=2, epoch=2))
    batches = list(global_batches(50, 16, seed=2, epoch=1))
    assert [len(b) for b in batches] == [16, 16, 16, 2]
    assert torch.equal(torch.cat(batches), order)
    assert torch.equal(torch.cat([rank_share(batches[0], r, 2) for r in range(2)]), batches[0])


def test_nonfinite_losses_are_skipped_then_stop_the_run() -> None:
    model = _model()
    calls = {"n": 0}

    def sometimes_nan(model: nn.Module, batch: dict) -> torch.Tensor:
        calls["n"] += 1
        loss = _loss(model, batch)
        return loss * float("nan") if calls["n"] in (2, 3) else loss

    result = fit(
        model,
        _data(),
        objective=ERM(sometimes_nan),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        cfg=TrainConfig(max_steps=6, batch_size=16, progress=False),
    )
    assert result.skipped_steps == 2 and result.steps == 6
    assert all(torch.isfinite(p).all() for p in model.parameters())

    def always_nan(model: nn.Module, batch: dict) -> torch.Tensor:
        return _loss(model, batch) * float("inf")

    with pytest.raises(NumericalError, match="non-finite losses"):
        fit(
            model,
            _data(),
            objective=ERM(always_nan),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            cfg=TrainConfig(max_steps=20, batch_size=16, max_bad_steps=3, progress=False),
        )


def test_bad_batches_and_empty_data_raise_clear_errors() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = TrainConfig(max_steps=2, batch_size=4, progress=False)
    with pytest.raises(DataError, match="empty"):
        fit(model, [], objective=ERM(_loss), optimizer=opt, cfg=cfg)
    bad = _data(8)
    bad[3] = {"x": torch.full((8,), float("nan")), "y": torch.tensor(0)}
    with pytest.raises(DataError, match="NaN or Inf"):
        fit(
            model,
            bad,
            objective=ERM(_loss),
            optimizer=opt,
            cfg=TrainConfig(epochs=1, batch_size=8, progress=False),
        )


def test_length_grouped_batches_cover_every_example_once_and_cut_padding() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 60, (1000,), generator=gen).tolist()
    grouped = list(global_batches(1000, 32, seed=3, epoch=1, lengths=lengths, group=10))
    plain = list(global_batches(1000, 32, seed=3, epoch=1))
    assert len(grouped) == len(plain) == 32  # ceil(1000 / 32): the epoch's step count is unchanged
    assert sorted(torch.cat(grouped).tolist()) == list(range(1000))
    # a function of (seed, epoch): a resumed run continues from batch `start` with the same batches
    again = list(global_batches(1000, 32, seed=3, epoch=1, start=5, lengths=lengths, group=10))
    assert all(torch.equal(a, b) for a, b in zip(again, grouped[5:], strict=True))

    def padded(batches: list) -> int:
        return sum(len(b) * max(lengths[i] for i in b.tolist()) for b in batches)

    assert padded(grouped) < 0.75 * padded(plain)
