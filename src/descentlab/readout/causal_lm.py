"""Causal LMs of any family (Llama, GPT-2, OPT, Falcon, ...): the logit lens, final transform + LM head on
every layer, with chunked CE.

f_l = (1/N) Σ_{t valid} CE(head(tail(Φ_l[t])), y_{t+1})       l = 0..L

over the N next-token targets that are not -100 (the model's own loss is the same mean, so f_L equals it).
``tail`` is what the backbone applies after its last block, traced from the model's structure
(:mod:`descentlab.readout.structure`): the final norm (``norm``, ``ln_f``, OPT's
``decoder.final_layer_norm`` then its optional ``project_out``, ...). Layer L is the backbone's own
``last_hidden_state`` (already through the tail), so the final norm is applied exactly once per layer.
``head`` is the output embedding with the model's logit post-processing (Gemma's soft-capping, a
``logit_scale``); it is checked once per model against the model's own forward on the same state, and
when it differs the model's own head code is replayed instead (:func:`~descentlab.readout.structure.replay_head`).

Cost. Naively the L+1 layers give (L+1)·N·V logits at once, and autograd keeps them for the backward pass.
Here each layer is read by :func:`~descentlab.linear_cross_entropy.linear_cross_entropy` when the head is a
plain ``nn.Linear``: the rows with a target are picked by index from the layer's own hidden state
``chunk_size`` at a time, the tail and head run on that chunk, and neither the rows nor the logits are
kept. Layer L (a mean, the objective) gets its gradients in the forward pass (three head matmuls per
token); layers 0..L-1, whose weights in the Lagrangian come later, keep one logsumexp per row and recompute
their logits once in the backward pass (four). A model whose own head code must be replayed takes the
unfused path: rows stacked, chunks checkpointed (``checkpoint``), as :func:`chunked_token_ce` does.
``sample_tokens`` reads the intermediate layers on a uniform random subset of the N targets, drawn without
replacement and shared by layers 0..L-1: each f_l is then an unbiased estimate of its full-batch value,
and the shared subset keeps ĝ_l = f_l - (1-α) f_{l-1} low-variance. Layer L always uses every token, so
the objective is exact.

The default, ``sample_tokens="auto"``, bounds the readout's cost by the batch instead of by the depth.
Reading all R intermediate layers on every token costs R extra passes through the LM head, and the head is
often as large as many blocks (Llama-3 8B: 525M parameters, 32 layers): about 3x an ERM step at 8B, 4x at
the benchmark's 8 x 512 shape, whatever the kernel. With gradients enabled (a training step) "auto" reads
layers 0..L-1 on

    k = ⌈N / (2R)⌉ shared targets,

so the R layers together read N/2 rows: about two thirds of one extra head pass (their logits are
recomputed once in the backward pass), whatever the depth. Without gradients (evaluation, a layer profile)
every layer reads every token, so what is reported is exact. ``sample_tokens=None`` is the exact readout
in training too.

Variance. With k of the N targets drawn without replacement and shared by the R layers, write
d_t = CE_l(t) - (1-α) CE_{l-1}(t) for a drawn target t. Then ĝ_l = mean_t d_t is unbiased for the
full-batch g_l, with

    Var(ĝ_l) = (1 - k/N) S_d² / k,        S_d² the variance of d over the N targets,

and likewise Var(f̂_l) with CE_l(t) in place of d_t. The readout estimates S_d² by the sample variance of
the k drawn d_t (unbiased for S_d² under sampling without replacement), so each step carries its own
standard errors: :meth:`CausalLMReadout.standard_errors` (f̂_l and ĝ_l, for a given α) and
:meth:`CausalLMReadout.wrong_sign_probability` (the normal approximation of P(sign ĝ_l ≠ sign g_l), with
ĝ_l in place of g_l), from ``CausalLMReadout.last_estimate`` (a :class:`SampledEstimate`), kept on the device (nothing is read
unless asked). Sharing the tokens across layers is what makes S_d small: CE_l(t) and CE_{l-1}(t) are
strongly correlated, so S_d² = S_l² + (1-α)² S_{l-1}² - 2(1-α) Cov is far below the independent-draw sum.
The ``ratio`` form f_l / f_{l-1} of the constraint divides two such means: the ratio of unbiased means is
biased, by about (f_l Var(f̂_{l-1}) / f_{l-1}³ - Cov(f̂_l, f̂_{l-1}) / f_{l-1}²) to first order (delta
method), so ``LayerwiseDescent.lagrangian(f, estimate=readout.last_estimate)`` refuses it when the sampled
ĝ would reach the dual step; use the ``difference`` form with a sampled readout, or ``sample_tokens=None``.
One step's se(ĝ_l) can be as large as the margin (SmolLM2-135M, 4 x 256 tokens: 0.49 nats against a
median |ĝ_l| of 0.99), and clamping λ at 0 turns that noise into λ > 0 on constraints that hold: the dual
step therefore ascends the mean ĝ of a window of ``dual_every`` steps, sized by
:func:`~descentlab.constrained.descent.dual_window` from these standard errors (the noise analysis is in
:mod:`descentlab.constrained.descent`).

Precision. Under ``torch.autocast`` the fused path's head matmuls run in the autocast dtype, as the
model's own head does, with the logsumexp in float32 (:mod:`descentlab.linear_cross_entropy`).

The structure (final transform) and the head check run once per model, on a separate forward of one row
and two positions without gradients, so the first training step's peak memory is that of every later one.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from descentlab.errors import ConfigError, DataError, ModelError
from descentlab.linear_cross_entropy import linear_cross_entropy
from descentlab.losses import IGNORE_INDEX, chunked_token_nll, head_token_nll
from descentlab.readout.base import Batch, InnerCall, Readout, accepts, hidden_states_of, model_inputs
from descentlab.readout.structure import (
    BackbonePlan,
    backbone_forward,
    backbone_of,
    minimal_inputs,
    probing,
    replay_head,
)

_HEAD_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def next_token_targets(batch: Batch) -> Tensor:
    """``labels`` (or ``input_ids`` with padding set to -100), shifted: position t predicts token t+1."""
    labels = batch.get("labels")
    if not isinstance(labels, Tensor):
        labels = batch.get("input_ids")
        if not isinstance(labels, Tensor):
            raise DataError(
                "a causal-LM batch needs 'input_ids' (and optionally 'labels' with -100 to ignore)"
            )
        mask = batch.get("attention_mask")
        if isinstance(mask, Tensor):
            labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
    return labels[:, 1:]


# the per-token CE lives in descentlab.losses; these names stay for existing callers
token_ce = head_token_nll
chunked_token_ce = chunked_token_nll


@dataclass
class SampledEstimate:
    """What the last :meth:`CausalLMReadout.compute` read: ``sampled`` (layers 0..L-1 read on k < N drawn
    targets), ``k``, ``n``, the layers read, and ``per_token``, the detached per-target losses of those
    layers ``[len(layers), k]`` (on the device; None when nothing was sampled). Layer L is always exact."""

    sampled: bool
    k: int
    n: int
    layers: list[int]
    per_token: Tensor | None

    def _fpc(self) -> float:
        return (1.0 - self.k / self.n) / self.k if self.k > 1 else math.nan

    def standard_errors(self, alpha: float | Tensor | None = None) -> dict[str, Tensor]:
        """Standard errors of the sampled f̂_l (key ``"f"``, one per layer read) and, given ``alpha``, of
        ĝ_l = f̂_l - (1-α) f̂_{l-1} for the read layers whose predecessor was read too (key ``"g"``, NaN
        elsewhere), with the finite-population correction (module docs). Zeros when nothing was sampled.
        Device tensors: nothing is read back."""
        if self.per_token is None:
            zeros = torch.zeros(len(self.layers))
            return {"f": zeros, "g": zeros.clone()}
        x = self.per_token.float()
        out = {"f": (x.var(dim=1, unbiased=True) * self._fpc()).sqrt()}
        if alpha is not None:
            g = x.new_full((len(self.layers),), float("nan"))
            # a tensor α stays on the device; numbers stay Python floats (a tensor made from them would be a
            # blocking host-to-device copy on a GPU)
            if isinstance(alpha, Tensor):
                a: Tensor | list[float] = alpha.to(device=x.device, dtype=x.dtype).reshape(-1)
            else:
                a = [float(v) for v in alpha] if isinstance(alpha, (list, tuple)) else [float(alpha)]
            count = a.numel() if isinstance(a, Tensor) else len(a)
            for j, layer in enumerate(self.layers):
                if j > 0 and self.layers[j - 1] == layer - 1:
                    keep = 1 - a[min(layer - 1, count - 1)]
                    d = x[j] - keep * x[j - 1]
                    g[j] = (d.var(unbiased=True) * self._fpc()).sqrt()
            out["g"] = g
        return out

    def violation_errors(self, f: Tensor, alpha: Tensor, form: str = "difference") -> Tensor:
        """Standard errors of ĝ_1..ĝ_L as :class:`~descentlab.constrained.descent.LayerwiseDescent` forms them
        from ``f`` (the L+1 losses this call returned) and ``alpha`` [L], one tensor [L] on the device.

        ĝ_l is linear in the per-target losses of layers l and l-1 (to first order for ``form="ratio"``,
        the delta method at the sampled means), so se(ĝ_l) = sqrt((1 - k/N) S_d² / k) with d_t = a_l CE_l(t)
        - b_l CE_{l-1}(t): a = 1, b = 1 - α_l for the difference, a = 1 / f_{l-1}, b = f_l / f_{l-1}² for the
        ratio. Layer L is read on every target, so it adds no variance: its row is 0. NaN where layer l or
        l-1 was not read (and everywhere when k = 1); zeros when nothing was sampled. No host read."""
        num = f.numel() - 1
        if self.per_token is None:
            return f.new_zeros(num)
        x = self.per_token.to(dtype=f.dtype, device=f.device)
        row = {layer: j for j, layer in enumerate(self.layers)}
        nan, zero = x.new_full((x.shape[1],), float("nan")), x.new_zeros(x.shape[1])
        # rows of layers 1..L (current) and 0..L-1 (previous); views and one stack each, so the cost is a
        # few kernels whatever the depth and nothing is read back
        cur = torch.stack([x[row[i]] if i in row else nan for i in range(1, num)] + [zero])
        prev = torch.stack([x[row[i]] if i in row else nan for i in range(num)])
        f = f.detach()
        if form == "ratio":
            a, b = 1.0 / f[:-1], f[1:] / f[:-1].square()
        else:
            a, b = torch.ones_like(f[1:]), 1.0 - alpha.to(device=f.device, dtype=f.dtype)
        d = a[:, None] * cur - b[:, None] * prev
        return (d.var(dim=1, unbiased=True) * self._fpc()).sqrt()


class CausalLMReadout(Readout):
    """Logit-lens per-layer loss of a Hugging Face ``*ForCausalLM`` / ``*LMHeadModel``.

    Args:
        chunk_size: tokens per CE chunk (None: all logits at once, the slow reference).
        sample_tokens: "auto" (the default) reads layers 0..L-1 on ⌈N / (2R)⌉ uniformly drawn targets shared
            by those R layers when gradients are enabled, and on all N without (module docs); an int k (or
            a fraction in (0, 1]) reads them on k drawn targets always (an unbiased estimate); None reads
            every layer on all N targets always (exact, about R extra LM-head passes per step).
        checkpoint: on the unfused path, recompute chunk logits in the backward pass (memory O(chunk·V)
            instead of O(L·N·V)). The fused path never keeps logits.
        fused: read each layer with :func:`~descentlab.linear_cross_entropy.linear_cross_entropy` when the
            LM head is a plain ``nn.Linear`` that reproduces the model's logits (and ``chunk_size`` is set);
            False: stack the rows and run :func:`chunked_token_ce` through the head (the slow twin, also
            the path of a model whose own head code must be replayed).
        layers: read out only these of layers 0..L-1 (layer L always); the others come back as NaN (no
            gradient). For constraints on a subset of layers (l and l-1 of each constrained l), this cuts the
            head cost of the readout in proportion. A negative index counts from L (-1: layer L-1, so
            ``layers=[-1]`` is the final constraint's check at one extra head pass). None reads every layer.
        generator: torch.Generator for the token subsample (None: the global RNG).
    """

    name = "causal_lm"

    def __init__(
        self,
        chunk_size: int | None = 1024,
        sample_tokens: int | float | str | None = "auto",
        *,
        checkpoint: bool = True,
        layers: list[int] | None = None,
        generator: torch.Generator | None = None,
        fused: bool = True,
    ) -> None:
        if layers is not None and (not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
            raise ConfigError(
                f"layers must list layer indices (0 = the embedding output, -1 = layer L-1), got {layers!r}"
            )
        self.layers = None if layers is None else sorted(set(layers), key=lambda i: (i < 0, i))
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ConfigError(f"chunk_size must be a positive int or None (got {chunk_size!r})")
        if sample_tokens is not None and sample_tokens != "auto":
            ok_int = isinstance(sample_tokens, int) and sample_tokens >= 1
            ok_frac = isinstance(sample_tokens, float) and 0.0 < sample_tokens <= 1.0
            if not (ok_int or ok_frac):
                raise ConfigError(
                    f"sample_tokens must be 'auto', an int >= 1, a fraction in (0, 1], or None "
                    f"({sample_tokens!r})"
                )
        self.chunk_size = chunk_size
        self.sample_tokens = sample_tokens
        self.checkpoint = checkpoint
        self.generator = generator
        self.fused = fused
        #: What the last call read (sampled or exact, k of n, per-target losses of a sample); see
        #: :meth:`standard_errors`. f_l (l < L) and ĝ_l of a step where ``last_estimate.sampled`` is True are
        #: sampled estimates, not full-batch values: ``Constrained`` (and ``LayerwiseDescent.log_values``
        #: given this estimate) logs them as ``f_sampled/l``, ``g_sampled/l`` with ``g_se/l``.
        self.last_estimate: SampledEstimate | None = None

    def reading(self, layers: list[int] | None) -> CausalLMReadout:
        """The same readout (chunks, sampling, generator) reading only ``layers`` of 0..L-1."""
        return CausalLMReadout(
            self.chunk_size,
            self.sample_tokens,
            checkpoint=self.checkpoint,
            layers=layers,
            generator=self.generator,
            fused=self.fused,
        )

    def standard_errors(self, alpha: float | Tensor | None = None) -> dict[str, Tensor]:
        """Standard errors of the last call's sampled f̂_l and ĝ_l (see :class:`SampledEstimate`)."""
        if self.last_estimate is None:
            raise ConfigError("standard_errors: the readout has not read a batch yet")
        return self.last_estimate.standard_errors(alpha)

    def wrong_sign_probability(self, g_hat: Tensor, alpha: float | Tensor) -> Tensor:
        """P(sign ĝ_l ≠ sign g_l) per read layer, by the normal approximation Φ(-|ĝ_l| / se(ĝ_l)) with the
        estimate ĝ_l in place of the unknown g_l (``g_hat`` indexed by the layers read, as
        ``last_estimate.layers``). 0 when nothing was sampled; NaN where ĝ_l has no standard error."""
        se = self.standard_errors(alpha)["g"].to(g_hat.device)
        z = g_hat.detach().float().abs() / se
        return torch.where(se > 0, 0.5 * torch.erfc(z / math.sqrt(2.0)), torch.zeros_like(z))

    def supports(self, model: nn.Module) -> bool:
        cls = type(model).__name__
        if not (cls.endswith("ForCausalLM") or cls.endswith("LMHeadModel")):
            return False
        base = getattr(model, "base_model", None)
        return isinstance(base, nn.Module) and base is not model

    def _logits_fn(
        self, model: nn.Module, base: nn.Module, plan: BackbonePlan | None
    ) -> Callable[[Tensor], Tensor]:
        """rows ``[n, H]`` -> logits ``[n, V]``: the tail (when ``plan`` is given), the head, post-processing."""
        head = model.get_output_embeddings()
        if head is None:
            raise ModelError(
                f"{type(model).__name__} has no output embeddings (LM head) to read layers out with"
            )
        scale, cap = _postprocessing(model)

        def logits_fn(x: Tensor) -> Tensor:
            logits = head(plan.apply_tail(base, x) if plan is not None else x)
            if scale is not None:
                logits = logits * scale
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            return logits

        return logits_fn

    def _replayed_logits_fn(
        self,
        model: nn.Module,
        base: nn.Module,
        plan: BackbonePlan | None,
        out: object,
        call_model: InnerCall,
        inputs: dict[str, Tensor],
        trace: BackbonePlan,
    ) -> Callable[[Tensor], Tensor]:
        """The model's own head code on rows ``[n, H]`` (its backbone returning them as one sequence)."""

        def logits_fn(x: Tensor) -> Tensor:
            last = plan.apply_tail(base, x) if plan is not None else x
            fields = dict(out.items())
            fields["last_hidden_state"] = last[None]
            result = replay_head(call_model, base, type(out)(**fields), inputs, trace)
            return result.logits[0]

        return logits_fn

    def _head_is_ours(
        self,
        model: nn.Module,
        base: nn.Module,
        base_inputs: dict[str, Tensor],
        call_model: InnerCall,
        head_inputs: dict[str, Tensor],
        trace: BackbonePlan,
    ) -> bool:
        """Whether our head reproduces the model's own logits (checked once per model, on a separate forward
        of one row and two positions without gradients, so the training step holds no extra logits)."""
        ok = _HEAD_CHECKED.get(model)
        if ok is None:
            with probing(base):
                small = base(**minimal_inputs(base_inputs), output_hidden_states=True, return_dict=True)
                last = small.last_hidden_state
                ours = self._logits_fn(model, base, None)(last.reshape(-1, last.shape[-1]))
                theirs = replay_head(call_model, base, small, minimal_inputs(head_inputs), trace).logits
                theirs = theirs.reshape(-1, theirs.shape[-1]).to(ours.dtype)
            ok = ours.shape == theirs.shape and bool(torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5))
            _HEAD_CHECKED[model] = ok
        return ok

    def sample_size(self, n: int, layers_read: int) -> int:
        """How many of the ``n`` targets layers 0..L-1 read (``n``: all of them, exactly).

        ``"auto"``: ⌈n / (2R)⌉ for R = ``layers_read`` when gradients are enabled, else n."""
        k = self.sample_tokens
        if k is None or layers_read == 0:
            return n
        if k == "auto":
            return -(-n // (2 * layers_read)) if torch.is_grad_enabled() else n
        return min(n, k if isinstance(k, int) else max(1, round(k * n)))

    def _sample(self, n: int, layers_read: int, device: torch.device) -> Tensor | None:
        k = self.sample_size(n, layers_read)
        if k >= n:
            return None
        if self.generator is None or self.generator.device == device:
            # drawn where it is used: no copy (on the CPU the same draws as the CPU default generator's)
            return torch.randperm(n, generator=self.generator, device=device)[:k]
        drawn = torch.randperm(n, generator=self.generator, device=self.generator.device)[:k]
        if drawn.device.type == "cpu" and device.type == "cuda":
            drawn = drawn.pin_memory()  # a pinned source lets the copy below run without blocking the host
        return drawn.to(device, non_blocking=True)

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        if not isinstance(batch, Mapping):
            raise DataError(f"expected a dict batch with input_ids, got {type(batch).__name__}")
        base = backbone_of(model)
        inputs = model_inputs(base, batch)
        if accepts(base, "use_cache"):
            inputs["use_cache"] = False  # a KV cache is useless here and costs memory

        def run(small: dict | None = None):
            return base(**(inputs if small is None else small), output_hidden_states=True, return_dict=True)

        plan, out = backbone_forward(base, run, lambda tokens: run(minimal_inputs(inputs, tokens)))
        states = hidden_states_of(out, getattr(model.config, "num_hidden_layers", None), model)
        targets = next_token_targets(batch).to(states[0].device)
        valid = targets != IGNORE_INDEX
        n = int(valid.sum())  # the batch's one host read: it sizes the subsample
        if n == 0:
            raise DataError(
                "no target token in the batch (all labels are -100); per-layer LM losses need targets"
            )
        # the rows with a target, as indices into a flattened [B·T] state, selected with the count known (a
        # boolean mask would read the count again)
        batch_size, length = valid.shape[0], valid.shape[1] + 1
        positions = torch.arange(batch_size * length, device=valid.device).view(batch_size, length)[:, :-1]
        picked = valid.flatten().nonzero_static(size=n).squeeze(1)
        idx = positions.flatten().index_select(0, picked)
        y = targets.flatten().index_select(0, picked)
        head_inputs = model_inputs(model, batch)
        ours = self._head_is_ours(model, base, inputs, call_model, head_inputs, plan)
        num_inner = len(states) - 1
        if self.layers is None:
            read = list(range(num_inner))
        else:  # negative indices count from L; out-of-range ones read nothing
            read = sorted({i + num_inner if i < 0 else i for i in self.layers} & set(range(num_inner)))
        sample = self._sample(n, len(read), y.device)
        self._per_token: Tensor | None = None
        linear = model.get_output_embeddings()
        if self.fused and self.chunk_size is not None and ours and type(linear) is nn.Linear:
            last, means = self._fused(model, base, plan, out, states, idx, y, sample, read)
        else:

            def head(tail: BackbonePlan | None) -> Callable[[Tensor], Tensor]:
                if ours:
                    return self._logits_fn(model, base, tail)
                return self._replayed_logits_fn(model, base, tail, out, call_model, head_inputs, plan)

            last, means = self._unfused(out, states, idx, y, sample, read, head, plan)
        k = n if sample is None else int(sample.numel())
        self.last_estimate = SampledEstimate(sample is not None, k, n, read, self._per_token)
        if not read:
            return torch.cat([last.new_full((num_inner,), float("nan")), last[None]])
        if len(read) == num_inner:
            return torch.cat([means, last[None]])
        f = last.new_full((num_inner,), float("nan"))
        f = f.index_copy(0, torch.tensor(read, device=f.device), means.to(f.dtype))
        return torch.cat([f, last[None]])

    def _unfused(
        self,
        out: object,
        states: tuple[Tensor, ...],
        idx: Tensor,
        y: Tensor,
        sample: Tensor | None,
        read: list[int],
        head: Callable[[BackbonePlan | None], Callable[[Tensor], Tensor]],
        plan: BackbonePlan,
    ) -> tuple[Tensor, Tensor | None]:
        """The slow twin: rows gathered and stacked, then :func:`chunked_token_ce` through ``head``."""

        def rows(h: Tensor, subset: Tensor | None) -> Tensor:
            picked = h.reshape(-1, h.shape[-1]).index_select(0, idx)
            return picked if subset is None else picked[subset]

        # Layer L: every token of the backbone's own last_hidden_state, already through the tail.
        ce_last = chunked_token_ce(
            rows(out.last_hidden_state, None), y, head(None), self.chunk_size, self.checkpoint
        )
        if not read:
            return ce_last.mean(), None
        # Layers 0..L-1: one chunked pass over their stacked rows (same targets for every layer), through
        # the traced tail (the final norm) and the head.
        y_inner = y if sample is None else y[sample]
        x_inner = torch.cat([rows(states[i], sample) for i in read])
        ce_inner = chunked_token_ce(
            x_inner, y_inner.repeat(len(read)), head(plan), self.chunk_size, self.checkpoint
        )
        per_token = ce_inner.view(len(read), -1)
        if sample is not None:
            self._per_token = per_token.detach()
        return ce_last.mean(), per_token.mean(1)

    def _fused(
        self,
        model: nn.Module,
        base: nn.Module,
        plan: BackbonePlan,
        out: object,
        states: tuple[Tensor, ...],
        idx: Tensor,
        y: Tensor,
        sample: Tensor | None,
        read: list[int],
    ) -> tuple[Tensor, Tensor | None]:
        """Each layer through :func:`linear_cross_entropy`: rows picked by index from the layer's own hidden
        state, the tail applied chunk by chunk inside it; no logits kept, and no rows stacked unless a token
        subsample makes them few (then layers 0..L-1 are read in one call)."""
        linear = model.get_output_embeddings()
        scale, softcap = _postprocessing(model)
        common = {
            "bias": linear.bias,
            "chunk_size": self.chunk_size,
            "scale": scale,
            "softcap": softcap,
        }
        # Layer L: the objective, a mean, so its gradients are formed in the forward pass.
        last = linear_cross_entropy(out.last_hidden_state, linear.weight, y, rows=idx, **common)
        if not read:
            return last, None
        # Layers 0..L-1: per-row losses (each layer's weight in the Lagrangian comes later), on the shared
        # token subsample when there is one.
        y_inner = y if sample is None else y[sample]
        idx_inner = idx if sample is None else idx[sample]
        tail_modules = [base.get_submodule(name) for name in plan.tail]
        tail_params = [p for m in tail_modules for p in m.parameters() if p.requires_grad]

        def tail(x: Tensor) -> Tensor:
            return plan.apply_tail(base, x)

        inner = {"transform": tail if tail_modules else None, "transform_params": tail_params}
        if sample is not None:
            # A subsample is small (under "auto", N/2 rows over all R layers): gather it from every read
            # layer into one [R·k, H] block and read it in one call, so the backward forms one head
            # gradient [V, H] instead of R (each zero-filled and summed) and runs larger matmuls.
            width = states[0].shape[-1]
            x = torch.cat([states[i].reshape(-1, width).index_select(0, idx_inner) for i in read])
            targets = y_inner.repeat(len(read))
            if x.shape[0] <= self.chunk_size:
                # One chunk: plain autograd keeps its logits, no more than one chunk of the fused path holds
                # at a time, and saves the fused path's recomputation of them in the backward pass.
                ce = chunked_token_ce(x, targets, self._logits_fn(model, base, plan), self.chunk_size, False)
            else:
                ce = linear_cross_entropy(x, linear.weight, targets, reduction="none", **inner, **common)
            self._per_token = ce.detach().view(len(read), -1)
            return last, ce.view(len(read), -1).mean(1)
        # Every token: one call per layer, rows picked by index, so no [R·N, H] stack is ever made.
        means = [
            linear_cross_entropy(
                states[i],
                linear.weight,
                y_inner,
                rows=idx_inner,
                reduction="none",
                **inner,
                **common,
            ).mean()
            for i in read
        ]
        return last, torch.stack(means)


def _postprocessing(model: nn.Module) -> tuple[float | None, float | None]:
    """(the logit multiplier, the soft-cap) that the model applies after its LM head."""
    scale = getattr(model, "logit_scale", None)
    divide = getattr(model.config, "logits_scaling", None)
    cap = getattr(model.config, "final_logit_softcapping", None)
    factor = 1.0
    if isinstance(scale, (int, float)):
        factor *= float(scale)
    if isinstance(divide, (int, float)) and divide != 1:
        factor /= float(divide)
    return (None if factor == 1.0 else factor), (float(cap) if cap else None)
