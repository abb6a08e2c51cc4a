"""The one next-token NLL (descentlab.losses) and its four callers against a plain F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from descentlab.losses import chunked_token_nll, next_token_nll, token_nll


def reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log softmax in float64, one row at a time, 0 where the shifted label is -100."""
    pred, tgt = logits[:, :-1].double(), labels[:, 1:]
    out = torch.zeros(tgt.shape, dtype=torch.float64)
    for b in range(tgt.shape[0]):
        for t in range(tgt.shape[1]):
            if tgt[b, t] != -100:
                out[b, t] = F.cross_entropy(pred[b, t][None], tgt[b, t][None])
    return out


@pytest.fixture
def seq() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, 17, generator=gen) * 2
    labels = torch.randint(0, 17, (3, 11), generator=gen)
    labels[1, 6:] = -100
    return logits, labels


@pytest.mark.parametrize("chunk", [None, 1, 4, 100])
def test_next_token_nll(seq: tuple[torch.Tensor, torch.Tensor], chunk: int | None) -> None:
    logits, labels = seq
    ref = reference(logits, labels)
    got = next_token_nll(logits, labels, chunk=chunk, dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    total = next_token_nll(logits, labels, chunk=chunk, dtype=torch.float64, reduction="sum")
    torch.testing.assert_close(total, ref.sum(), rtol=1e-12, atol=1e-12)
    f32 = next_token_nll(logits, labels, chunk=chunk)
    torch.testing.assert_close(f32, ref, rtol=1e-5, atol=1e-5)


def test_chunking_is_bit_identical(seq: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, labels = seq
    whole = next_token_nll(logits, labels)
    assert torch.equal(whole, next_token_nll(logits, labels, chunk=3))
    assert torch.equal(token_nll(logits, labels), token_nll(logits, labels))


def test_chunked_head_rows_and_gradients() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 13)
    x = torch.randn(25, 8, requires_grad=True)
    y = torch.randint(0, 13, (25,))
    ref = F.cross_entropy(head(x), y, reduction="none")
    (gx_ref,) = torch.autograd.grad(ref.sum(), x)
    for chunk in (None, 4, 25, 64):
        got = chunked_token_nll(x, y, head, chunk)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
        (gx,) = torch.autograd.grad(got.sum(), x)
        torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)


class TinyLM(nn.Module):
    """logits = table[input_ids] (a causal LM whose logits are known)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: object):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_callers_match_reference() -> None:
    from descentlab.evaluation.curves import token_nll_metric
    from descentlab.evaluation.judge import score_examples
    from descentlab.evaluation.judge import token_nll as judge_nll
    from descentlab.models.perplexity import evaluate_lm, token_nll_sum

    gen = torch.Generator().manual_seed(1)
    model = TinyLM(torch.randn(19, 19, generator=gen))
    ids = torch.randint(1, 19, (4, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    logits = model(ids).logits.detach()
    labels = ids.masked_fill(mask == 0, -100)
    ref = reference(logits, labels)

    torch.testing.assert_close(judge_nll(logits, labels), ref, rtol=1e-6, atol=1e-6)
    num, den = token_nll_metric(model, {"input_ids": ids, "attention_mask": mask})
    torch.testing.assert_close(num, ref.sum(1), rtol=1e-12, atol=1e-12)
    assert den.tolist() == (labels[:, 1:] != -100).sum(1).tolist()
    torch.testing.assert_close(token_nll_sum(logits, ids), reference(logits, ids).sum(), rtol=1e-6, atol=1e-6)
    ev = evaluate_lm(model, ids, batch_size=3)
    assert ev.nll == pytest.approx(float(reference(logits, ids).mean()), rel=1e-6)

    def collate(examples, pad):
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    scores = score_examples(model, [{"input_ids": [1]}] * 4, pad_token_id=0, batch_size=4, collate_fn=collate)
    torch.testing.assert_close(scores.all_nll, ref.sum(1), rtol=1e-6, atol=1e-6)
