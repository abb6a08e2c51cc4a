"""Head-to-head judges of two causal LMs on the same prompts under the same embedding noise.

A judge returns one *preference* per example, p_i ∈ [0, 1]: 1 when model A wins, 0 when B wins, 1/2 for a
tie. The win rate of A over B is their mean, so ties are split and

    win_rate(A, B) + win_rate(B, A) = 1,      win_rate(A, A) = 1/2.

:func:`preference_summary` turns preferences into a :class:`~descentlab.evaluation.winrate.WinRate`.

* :class:`LikelihoodJudge` (offline default): the model that gives the reference continuation the lower
  negative log-likelihood wins. NLLs within ``tol`` nats of each other tie.
* :class:`GenerativeJudge`: both models generate a response (greedy), then any local causal LM reads a
  pairwise prompt, and its log-likelihoods of the two answer labels give the verdict. Each pair is
  shown in both orders and the two verdicts are averaged, which cancels the judge's position bias:
  ``p_i = (v(A, B) + 1 - v(B, A)) / 2`` with v(first, second) the verdict that the first response is better.

Noise (:class:`Noise`) goes through :func:`descentlab.perturbations.hooks.perturb_embeddings`, whose draws are
keyed by example content: both models see the same noise on the same prompt.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, DataError, NumericalError
from descentlab.evaluation.winrate import WinRate
from descentlab.losses import IGNORE_INDEX, next_token_nll

Example = Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class Noise:
    """Embedding noise for an evaluation: ``kind`` at level ``gamma``, draw ``draw`` of seed ``seed``."""

    kind: str = "gaussian"
    gamma: float = 0.0
    seed: int = 0
    draw: int = 0

    def apply(self, model: nn.Module, *, pad_token_id: int | None = None, key: str = "content") -> Any:
        """A context manager that perturbs ``model``'s input embeddings (a no-op at γ = 0)."""
        if self.gamma == 0:
            return contextlib.nullcontext()
        from descentlab.perturbations.hooks import perturb_embeddings

        return perturb_embeddings(
            model, self.kind, self.gamma, self.seed, draw=self.draw, pad_token_id=pad_token_id, key=key
        )


@dataclass(frozen=True)
class Scores:
    """Per-example sums of next-token NLL (nats) and token counts.

    ``reference_*`` count only labelled tokens (the reference continuation); ``all_*`` every predicted
    token of the sequence (positions 1..n-1), which gives the perplexity of the whole held-out text.
    """

    reference_nll: Tensor
    reference_tokens: Tensor
    all_nll: Tensor
    all_tokens: Tensor

    def perplexity(self, which: str = "all") -> float:
        """Token-weighted perplexity ``exp(Σ nll / Σ tokens)`` over the examples."""
        nll, n = (
            (self.all_nll, self.all_tokens) if which == "all" else (self.reference_nll, self.reference_tokens)
        )
        mean = float(nll.sum()) / max(1, int(n.sum()))
        return math.exp(mean) if mean < 700 else math.inf


Collate = Callable[[Sequence[Example], int], Mapping[str, Tensor]]


def token_nll(logits: Tensor, targets: Tensor, *, chunk: int = 128) -> Tensor:
    """Per-position next-token NLL ``[B, T-1]`` in float64, 0 where the target is -100.

    :func:`descentlab.losses.next_token_nll` of ``logits [B, T, V]`` (position t predicts token t+1) and
    the unshifted ``targets [B, T]``, with a float32 log-softmax over ``chunk`` positions at a time.
    """
    return next_token_nll(logits, targets, chunk=chunk, dtype=torch.float32, ignore_index=IGNORE_INDEX)


@torch.no_grad()
def score_examples(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    pad_token_id: int,
    batch_size: int = 8,
    collate_fn: Collate,
    noise: Noise | None = None,
) -> Scores:
    """NLL of each example's labelled tokens and of its whole sequence, batched and right-padded.

    ``collate_fn(examples, pad_token_id)`` right-pads a list of examples into ``input_ids``,
    ``attention_mask`` and ``labels`` (e.g. ``descentlab.data.instructions.collate_causal``); the caller
    passes it, so this module never loads data code.

    One forward pass per batch gives both: the reference score the likelihood judge compares and the
    all-token score that makes the held-out perplexity. The model runs in eval mode under ``noise``.
    The slow twin is :func:`score_examples_reference` (one unpadded example at a time, HF's own loss).
    """
    if not examples:
        raise DataError("no examples to score")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[Tensor] = []
    try:
        with (noise or Noise()).apply(model, pad_token_id=pad_token_id):
            for s in range(0, len(examples), batch_size):
                batch = collate_fn(examples[s : s + batch_size], pad_token_id)
                batch = {k: v.to(device) for k, v in batch.items()}
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                full_targets = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
                ref = token_nll(logits, batch["labels"])
                full = token_nll(logits, full_targets)
                counted_ref = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(1)
                counted_all = (full_targets[:, 1:] != IGNORE_INDEX).sum(1)
                out.append(
                    torch.stack([ref.sum(1), counted_ref.double(), full.sum(1), counted_all.double()], 1)
                )
    finally:
        model.train(was_training)
    table = torch.cat(out).cpu()
    if not torch.isfinite(table).all():
        raise NumericalError(
            "a model produced non-finite log-likelihoods; check its weights and the noise level"
        )
    return Scores(table[:, 0], table[:, 1].long(), table[:, 2], table[:, 3].long())


@torch.no_grad()
def score_examples_reference(
    model: nn.Module, examples: Sequence[Example], *, pad_token_id: int, noise: Noise | None = None
) -> Scores:
    """Slow twin of :func:`score_examples`: each example alone, unpadded, scored by the model's own loss."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = []
    try:
        with (noise or Noise()).apply(model, pad_token_id=pad_token_id):
            for e in examples:
                ids = torch.tensor([list(e["input_ids"])], device=device)
                labels = torch.tensor([list(e["labels"])], device=device)
                n_ref = int((labels[:, 1:] != IGNORE_INDEX).sum())
                n_all = ids.shape[1] - 1
                ref = float(model(input_ids=ids, labels=labels).loss) * n_ref if n_ref else 0.0
                full = float(model(input_ids=ids, labels=ids).loss) * n_all
                rows.append([ref, n_ref, full, n_all])
    finally:
        model.train(was_training)
    t = torch.tensor(rows, dtype=torch.float64)
    return Scores(t[:, 0], t[:, 1].long(), t[:, 2], t[:, 3].long())


def likelihood_preferences(nll_a: Tensor, nll_b: Tensor, *, tol: float = 1e-6) -> Tensor:
    """Per-example preference for A from the reference NLLs: lower NLL wins, ties split.

    p_i = 1 if a_i < b_i - tol;  0 if a_i > b_i + tol;  1/2 otherwise.

    Total (summed) NLLs are compared, so the rule does not depend on how a tokenizer splits the reference.
    """
    if nll_a.shape != nll_b.shape:
        raise DataError(
            f"NLL shapes differ: {tuple(nll_a.shape)} vs {tuple(nll_b.shape)}; score the same examples"
        )
    a, b = nll_a.double(), nll_b.double()
    p = torch.full_like(a, 0.5)
    p[a < b - tol] = 1.0
    p[a > b + tol] = 0.0
    return p


def preference_summary(preferences: Tensor) -> WinRate:
    """Win rate of A = mean preference (ties count half), with wins/ties/losses and the s.e. over examples.

    For the likelihood judge this equals ``descentlab.evaluation.winrate.win_rate`` on the NLLs (lower is
    better); it also summarises the soft or order-averaged preferences of :class:`GenerativeJudge`.
    """
    if preferences.numel() == 0:
        raise DataError("no preferences to summarise")
    p = preferences.double()
    rate = float(p.mean())
    wins, losses = int((p > 0.5).sum()), int((p < 0.5).sum())
    return WinRate(
        rate=rate,
        stderr=math.sqrt(rate * (1 - rate) / p.numel()),
        wins=wins,
        ties=p.numel() - wins - losses,
        losses=losses,
    )


class LikelihoodJudge:
    """Offline judge: lower NLL of the reference continuation wins; ties (within ``tol`` nats) split.

    Args:
        pad_token_id: padding id for batching.
        collate_fn: right-pads examples into a batch (see :func:`score_examples`).
        batch_size: examples per forward pass.
        tol: NLL difference (nats) below which two models tie.
    """

    def __init__(
        self, *, pad_token_id: int, collate_fn: Collate, batch_size: int = 8, tol: float = 1e-6
    ) -> None:
        self.pad_token_id, self.batch_size, self.tol = int(pad_token_id), int(batch_size), float(tol)
        self.collate_fn = collate_fn

    def preferences(
        self,
        model_a: nn.Module,
        model_b: nn.Module,
        examples: Sequence[Example],
        *,
        noise: Noise | None = None,
    ) -> Tensor:
        """Per-example preference for ``model_a`` over ``model_b`` under the same noise."""
        kw = {"pad_token_id": self.pad_token_id, "batch_size": self.batch_size, "noise": noise}
        a = score_examples(model_a, examples, collate_fn=self.collate_fn, **kw)
        b = score_examples(model_b, examples, collate_fn=self.collate_fn, **kw)
        return likelihood_preferences(a.reference_nll, b.reference_nll, tol=self.tol)


PAIRWISE_TEMPLATE = (
    "Two assistants answered the same prompt. Judge which response is more helpful, accurate and fluent.\n\n"
    "### Prompt:\n{prompt}\n\n### Response 1:\n{first}\n\n### Response 2:\n{second}\n\n"
    "Which response is better, 1 or 2?\nAnswer:"
)


def _batches(n: int, size: int) -> Iterator[slice]:
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


@torch.no_grad()
def generate_responses(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    eos_token_id: int | None,
    max_new_tokens: int = 64,
    batch_size: int = 4,
    noise: Noise | None = None,
) -> list[list[int]]:
    """Greedy continuations of token-id prompts (left-padded batches), under ``noise``.

    Decoding feeds one token per step, so the noise is keyed by (call, row) rather than by content: two
    models decoding the same batch get the same noise at the same step.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[list[int]] = []
    try:
        with (noise or Noise()).apply(model, pad_token_id=None, key="sequence"):
            for sl in _batches(len(prompts), batch_size):
                rows = [list(p) for p in prompts[sl]]
                width = max(len(r) for r in rows)
                ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, r in enumerate(rows):
                    ids[i, width - len(r) :] = torch.tensor(r)
                    mask[i, width - len(r) :] = 1
                gen = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad_token_id,
                    eos_token_id=eos_token_id,
                )
                for row in gen[:, width:].tolist():
                    if eos_token_id is not None and eos_token_id in row:
                        row = row[: row.index(eos_token_id)]
                    out.append(row)
    finally:
        model.train(was_training)
    return out


class GenerativeJudge:
    """Generate-then-judge with any local causal LM, each pair shown in both orders.

    The verdict on one ordering compares the judge's log-likelihood of the two answer labels after the
    pairwise prompt, ``s_k = log p(label_k | prompt)`` summed over the label's tokens (so labels that
    tokenise into several pieces, e.g. a space then a digit, work with any tokenizer):
    hard verdict ``v = 1[s_1 > s_2] + 1/2 · 1[s_1 = s_2]``, soft verdict ``v = σ(s_1 - s_2)``.

    Args:
        judge_model: a causal LM that reads the pairwise prompt.
        judge_tokenizer: its tokenizer.
        template: pairwise prompt with ``{prompt}``, ``{first}`` and ``{second}``.
        labels: the answers meaning "the first is better" and "the second is better".
        collate_fn: right-pads the judge's sequences into a batch (see :func:`score_examples`).
        soft: use σ(s_1 - s_2) instead of the hard verdict.
        batch_size: judge sequences per forward pass.
    """

    def __init__(
        self,
        judge_model: nn.Module,
        judge_tokenizer: Any,
        *,
        collate_fn: Collate,
        template: str = PAIRWISE_TEMPLATE,
        labels: tuple[str, str] = (" 1", " 2"),
        soft: bool = False,
        batch_size: int = 4,
    ) -> None:
        for field in ("{prompt}", "{first}", "{second}"):
            if field not in template:
                raise ConfigError(f"the pairwise template lacks the {field} field")
        ids = [list(judge_tokenizer(label, add_special_tokens=False)["input_ids"]) for label in labels]
        if not all(ids) or ids[0] == ids[1]:
            raise ConfigError(f"labels {labels!r} must tokenise to two different non-empty token sequences")
        self.model, self.tokenizer, self.template = judge_model, judge_tokenizer, template
        self.label_ids = (ids[0], ids[1])
        self.soft, self.batch_size = bool(soft), int(batch_size)
        self.collate_fn = collate_fn

    def verdicts(self, prompts: Sequence[str], firsts: Sequence[str], seconds: Sequence[str]) -> Tensor:
        """For each triple, the judge's verdict that the first response is better (1, 0, 1/2 on a tie)."""
        examples = []
        for p, a, b in zip(prompts, firsts, seconds, strict=True):
            ids = list(self.tokenizer(self.template.format(prompt=p, first=a, second=b))["input_ids"])
            for label in self.label_ids:
                examples.append({"input_ids": ids + label, "labels": [IGNORE_INDEX] * len(ids) + label})
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        scores = score_examples(
            self.model, examples, pad_token_id=pad, batch_size=self.batch_size, collate_fn=self.collate_fn
        )
        nll = scores.reference_nll.view(-1, 2)
        margin = nll[:, 1] - nll[:, 0]  # s_1 - s_2
        return torch.sigmoid(margin) if self.soft else 0.5 + 0.5 * torch.sign(margin)

    def compare_texts(
        self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str]
    ) -> Tensor:
        """Preference for A, each pair judged in both orders: ``(v(A, B) + 1 - v(B, A)) / 2``."""
        if not len(prompts) == len(responses_a) == len(responses_b):
            raise DataError("prompts and both models' responses must have the same length")
        forward = self.verdicts(prompts, responses_a, responses_b)
        backward = self.verdicts(prompts, responses_b, responses_a)
        return 0.5 * (forward + 1.0 - backward)

    def preferences(
        self,
        model_a: nn.Module,
        model_b: nn.Module,
        examples: Sequence[Example],
        *,
        tokenizer: Any,
        noise: Noise | None = None,
        max_new_tokens: int = 64,
    ) -> Tensor:
        """Generate from each example's prompt with both models under the same noise, then judge the pairs."""
        prompt_ids = [list(e["input_ids"][: e["prompt_length"][0]]) for e in examples]
        kw = {
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "max_new_tokens": max_new_tokens,
            "noise": noise,
        }
        gen_a = generate_responses(model_a, prompt_ids, **kw)
        gen_b = generate_responses(model_b, prompt_ids, **kw)
        decode = lambda rows: [tokenizer.decode(r, skip_special_tokens=True).strip() for r in rows]  # noqa: E731
        prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in prompt_ids]
        return self.compare_texts(prompts, decode(gen_a), decode(gen_b))


__all__ = [
    "PAIRWISE_TEMPLATE",
    "GenerativeJudge",
    "LikelihoodJudge",
    "Noise",
    "Scores",
    "generate_responses",
    "likelihood_preferences",
    "preference_summary",
    "score_examples",
    "score_examples_reference",
    "token_nll",
]
