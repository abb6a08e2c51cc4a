"""Global magnitude masks agree across two gloo ranks whose replicas differ by float noise (from sparsity/)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from descentlab.sparsity.masks import global_masks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_masks(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    w = {"a": torch.randn(50, 20), "b": torch.randn(20, 30)}
    # replicas that disagree slightly (as float noise would make them) must still prune the same entries
    w = {
        k: v + rank * 1e-3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(rank))
        for k, v in w.items()
    }
    masks = global_masks(w, 0.7)
    out[rank] = {k: v.clone() for k, v in masks.items()}
    torch.distributed.barrier()  # leave together: tearing gloo down under a connected peer can abort
    torch.distributed.destroy_process_group()


@pytest.mark.distributed
def test_global_masks_agree_across_ranks() -> None:
    manager = mp.Manager()
    out = manager.dict()
    mp.start_processes(_rank_masks, args=(2, _free_port(), out), nprocs=2, start_method="fork")
    m0, m1 = out[0], out[1]
    for k in m0:
        assert torch.equal(m0[k], m1[k])
    assert sum(int((~m).sum()) for m in m0.values()) == round(0.7 * 1600)
