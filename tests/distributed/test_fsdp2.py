"""Two gloo processes train a fully_shard-ed (FSDP2) GPT-2 through ``fit`` with PrimalDual(HORST), AC/DC and a
checkpoint-and-resume, then prune it; everything agrees across ranks and with one process.

The worker (``fsdp2_worker.py``) runs under torchrun; this process runs the same function unsharded. Masks
of the same weights are compared for equality (the distributed selection is exact); trained weights and λ
are compared up to float noise (FSDP2 reduce-scatters gradients, and HORST runs its foreach path on
DTensors and its fused kernel on plain tensors).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp2_worker.py")
WORLD = 2


@pytest.fixture(scope="module")
def launched(torchrun, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], ModuleType, Path]:
    out = tmp_path_factory.mktemp("fsdp2")
    ranks, worker = torchrun(WORKER, out)
    return ranks, worker, out


@pytest.mark.distributed
def test_sharded_masks_equal_one_process_masks_even_with_ties(launched) -> None:
    ranks, worker, _ = launched
    single = worker.tie_masks(sharded=False)
    assert ranks[0]["ties"].keys() == single.keys()
    for case, masks in single.items():
        for name, mask in masks.items():
            assert torch.equal(ranks[0]["ties"][case][name], mask), (case, name)
            assert torch.equal(ranks[1]["ties"][case][name], mask), (case, name)


@pytest.mark.distributed
def test_fit_with_acdc_checkpoint_and_resume_under_fsdp2_matches_one_process(launched, tmp_path) -> None:
    ranks, worker, _ = launched
    a, b = ranks
    assert a["world"] == WORLD
    name = "transformer.h.0.attn.c_attn.weight"
    assert a["local_shapes"][name][0] * WORLD == a["params"][name].shape[0]  # really sharded
    assert a["resumed_from_4"] is None and a["resumed_from_8"] == worker.HALF  # the second fit resumed
    # what must agree across ranks agrees bit for bit
    assert torch.equal(a["lambda_8"], b["lambda_8"])
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert all(torch.equal(a["masks"][k], b["masks"][k]) for k in a["masks"])
    # masks are real zeros, kept as local shards in the controller, whole in its state dict
    for k, mask in a["masks"].items():
        assert int((a["params"][k][~mask] != 0).sum()) == 0
        assert a["local_masks"][k].shape == a["local_shapes"][k]
    assert a["acdc_report"]["global"] == pytest.approx(0.5, abs=1e-3)

    single = worker.train(tmp_path / "single", sharded=False)
    assert single["resumed_from_8"] == worker.HALF
    torch.testing.assert_close(a["lambda_4"], single["lambda_4"], rtol=0, atol=1e-6)
    torch.testing.assert_close(a["lambda_8"], single["lambda_8"], rtol=0, atol=1e-6)
    for k, value in single["params"].items():
        torch.testing.assert_close(a["params"][k], value, rtol=1e-4, atol=1e-4)  # as the DDP test
    assert a["masks"].keys() == single["masks"].keys()
    assert all(torch.equal(a["masks"][k], single["masks"][k]) for k in a["masks"])
    assert (
        a["global"]["zeros"] == single["global"]["zeros"]
        and a["layer"]["tensors"] == single["layer"]["tensors"]
    )
    assert a["global"]["global"] == pytest.approx(0.6, abs=1e-3)


@pytest.mark.distributed
def test_one_shot_pruning_of_the_sharded_weights_equals_one_process_pruning_of_the_same_weights(
    launched,
) -> None:
    ranks, worker, _ = launched
    a = ranks[0]
    import descentlab as dl

    model = worker.build(sharded=False)[0]
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(a["params"][k])
    dl.prune_magnitude(model, 0.6, scope="global")
    assert all(torch.equal(p.detach(), a["global_params"][k]) for k, p in model.named_parameters())
    dl.prune_magnitude(model, 0.8, scope="layer")
    assert all(torch.equal(p.detach(), a["layer_params"][k]) for k, p in model.named_parameters())


@pytest.mark.distributed
def test_the_sharded_checkpoint_is_a_whole_one_process_checkpoint(launched) -> None:
    ranks, worker, out = launched
    from descentlab.train.checkpoint import load_latest

    ckpt = load_latest(out / "run" / "checkpoints" / "main")
    assert ckpt is not None and ckpt.step == worker.TOTAL
    assert not any(p.name.startswith(".") for p in ckpt.path.parent.iterdir())  # no temporary folder left
    model, constraint, optimizer, acdc = worker.build(sharded=False)
    ckpt.load_model_(model)
    ckpt.load_optimizer_(optimizer)
    acdc.load_state_dict(ckpt.extra_state()["sparsity"])
    trained = ranks[0]
    assert all(torch.equal(p.detach(), trained["params"][k]) for k, p in model.named_parameters())
    torch.testing.assert_close(constraint.multipliers, trained["lambda_8"], rtol=0, atol=0)
    assert all(torch.equal(acdc.masks[k], trained["masks"][k]) for k in trained["masks"])
    assert len(optimizer.state) == len(list(model.parameters()))
