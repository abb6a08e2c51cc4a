"""DescentTrainer under two gloo processes (torchrun) agrees across ranks and with one process.

The same file is the torchrun worker: ``python -m torch.distributed.run --standalone --nproc_per_node=2
test_trainer_ddp.py OUT_DIR`` trains a tiny BERT with DescentTrainer (constraints, AdamW), evaluates it,
and saves each rank's λ history, parameters and eval metrics. The test runs :func:`train` in its own
process, without a process group, with the per-device batch equal to the global batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

WORLD = 2
GLOBAL_BATCH = 8
EVAL_BATCH = 8
N_TRAIN, N_EVAL, STEPS, LAYERS = 48, 16, 8, 2  # 6 steps per epoch: crosses an epoch boundary


def _label(ids: torch.Tensor) -> torch.Tensor:
    """Needs more than the first token: more than 6 of the 12 ids below 48."""
    return (ids < 48).sum() > 6


def train(out_dir: Path, world: int) -> dict[str, Any]:
    """Train and evaluate with DescentTrainer; per-device batches are the global batch split ``world`` ways."""
    from transformers import TrainerCallback, TrainingArguments

    import descentlab as dl
    from descentlab.integrations.hf import DescentTrainer
    from tiny_models import classification_rows, tiny_bert

    lams: list[torch.Tensor] = []

    class RecordLambda(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            lams.append(constraint.multipliers.detach().cpu().clone())

    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=0.05, dual_lr=0.5)
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=STEPS,
        per_device_train_batch_size=GLOBAL_BATCH // world,
        per_device_eval_batch_size=EVAL_BATCH // world,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        dataloader_num_workers=0,
        ddp_backend="gloo" if world > 1 else None,
    )
    trainer = DescentTrainer(
        model=tiny_bert(layers=LAYERS),
        args=args,
        train_dataset=classification_rows(N_TRAIN, seed=0, label=_label),
        eval_dataset=classification_rows(N_EVAL, seed=1, label=_label),
        constraint=constraint,
        callbacks=[RecordLambda()],
    )
    trainer.train()
    metrics = trainer.evaluate()
    return {
        "lambda": torch.stack(lams),
        "params": {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()},
        "eval": {k: v for k, v in metrics.items() if "/" in k or k == "eval_loss"},
        "world": int(trainer.args.world_size),
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    out = tmp_path_factory.mktemp("trainer_ranks")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ACCELERATE_USE_CPU": "true",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    proc = subprocess.run([*cmd, __file__, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.distributed
def test_descent_trainer_two_ranks_agree_and_match_one_process(ranks, tmp_path) -> None:
    a, b = ranks
    assert a["world"] == b["world"] == WORLD
    assert a["lambda"].shape == (STEPS, LAYERS)
    assert torch.equal(a["lambda"], b["lambda"])  # identical λ on both ranks, every step
    assert float(a["lambda"][-1].max()) > 0.0, "the duals never moved: the test would not see a wrong ĝ"
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert a["eval"] == b["eval"]  # eval metrics reduced over ranks, not one rank's half

    torch.set_num_threads(1)
    single = train(tmp_path / "single", world=1)
    assert single["world"] == 1
    torch.testing.assert_close(a["lambda"], single["lambda"], rtol=0, atol=1e-6)
    for name, value in single["params"].items():
        # Adam amplifies float-rounding differences of near-zero gradients (as in test_multiprocess.py)
        torch.testing.assert_close(a["params"][name], value, rtol=1e-4, atol=1e-4)
    assert a["eval"].keys() == single["eval"].keys()
    assert {f"eval_layer_loss/{i}" for i in range(LAYERS + 1)} <= a["eval"].keys()
    assert {f"eval_constraint_met/{i}" for i in range(1, LAYERS + 1)} <= a["eval"].keys()
    for key, value in single["eval"].items():
        assert a["eval"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def main(out_dir: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    result = train(out_dir / "run", world=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    torch.save(result, out_dir / f"rank{rank}.pt")
    dist.barrier()  # leave together: tearing gloo down under a connected peer can abort the process
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_models
    main(Path(sys.argv[1]))
