"""Issue 45 (4): training curves as metrics.csv and TensorBoard events, at log steps only, opt-in for fit."""

from __future__ import annotations

import csv
import multiprocessing
from pathlib import Path

import pytest
import torch
from torch import nn

from descentlab.logs import CSV_COLUMNS, CurveWriter, LazyLogs
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM
from descentlab.train.rundir import RunDir


def _data(n: int = 12) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=gen), "y": torch.tensor(i % 2)} for i in range(n)]


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def _fit(run: RunDir, log_every: int = 2) -> int:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    cfg = TrainConfig(max_steps=7, batch_size=4, log_every=log_every, progress=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return fit(model, _data(), objective=ERM(_loss), optimizer=opt, cfg=cfg, run=run, tag="job").steps


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_library_run_dir_writes_no_curves_by_default(tmp_path: Path) -> None:
    _fit(RunDir(tmp_path))
    assert (tmp_path / "metrics.jsonl").is_file()
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "tensorboard").exists()


def test_curves_hold_the_log_steps_in_csv_and_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert _fit(RunDir(tmp_path, curves=True), log_every=2) == 7
    rows = _rows(tmp_path)
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert sorted({int(r["step"]) for r in rows}) == [2, 4, 6, 7]  # log steps and the last one only
    assert {r["name"] for r in rows} == {"loss", "skipped", "lr"} and {r["tag"] for r in rows} == {"job"}
    assert all(float(r["value"]) == 0.1 for r in rows if r["name"] == "lr")
    jsonl = RunDir(tmp_path).metrics()
    csv_loss = [float(r["value"]) for r in rows if r["name"] == "loss"]
    assert csv_loss == [m["loss"] for m in jsonl]  # the same numbers as metrics.jsonl
    events = EventAccumulator(str(tmp_path / "tensorboard" / "job"))
    events.Reload()
    scalars = events.Scalars("loss")
    assert [e.step for e in scalars] == [2, 4, 6, 7]
    assert [e.value for e in scalars] == pytest.approx(csv_loss)  # event files hold float32


def test_writing_curves_reads_nothing_lazy_logs_had_not_read() -> None:
    """The writer takes host floats; a LazyLogs is read once, by whoever reads it first (run.log)."""
    logs = LazyLogs({"loss": torch.tensor(0.5)})
    assert not logs.read
    values = {**logs, "lr": 0.1}
    assert logs.read and values == {"loss": 0.5, "lr": 0.1}


def test_several_lr_groups_and_a_tensor_lr_are_logged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": torch.tensor(0.05)}, {"params": model[1].parameters()}],
        lr=0.1,
    )
    cfg = TrainConfig(max_steps=2, batch_size=4, log_every=1, progress=False)
    fit(model, _data(), objective=ERM(_loss), optimizer=opt, cfg=cfg, run=RunDir(tmp_path, curves=True))
    lrs = {(r["name"], round(float(r["value"]), 6)) for r in _rows(tmp_path) if r["name"].startswith("lr")}
    assert lrs == {("lr/0", 0.05), ("lr/1", 0.1)}  # the tensor lr is float32: 0.05000000074505806


def _append(folder: str, tag: str) -> None:
    with CurveWriter(folder, tag, tensorboard=False) as writer:
        for step in range(50):
            writer.write(step, {"loss": step / 10, "other": 1.0})


def test_concurrent_writers_share_one_header_and_lose_no_row(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(str(tmp_path), f"w{k}")) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    text = (tmp_path / "metrics.csv").read_text()
    assert text.count("time,tag,step,name,value") == 1 and text.startswith("time,tag")
    rows = _rows(tmp_path)
    assert len(rows) == 3 * 50 * 2
    assert {(r["tag"], int(r["step"])) for r in rows} == {(f"w{k}", s) for k in range(3) for s in range(50)}


def test_a_non_finite_value_is_written_as_it_is(tmp_path: Path) -> None:
    with CurveWriter(tmp_path, "", tensorboard=False) as writer:
        writer.write(1, {"loss": float("nan"), "lam": float("inf")})
    values = {r["name"]: r["value"] for r in _rows(tmp_path)}
    assert values == {"loss": "nan", "lam": "inf"} and _rows(tmp_path)[0]["tag"] == "main"
