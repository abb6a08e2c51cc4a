"""AC/DC: alternating compressed / decompressed training (Peste et al., NeurIPS 2021), as a controller.

The controller owns the masks; the model is never re-parametrised. Per optimizer step the loop calls::

    loss.backward()
    acdc.before_optimizer_step()   # == acdc.mask_grads_(): zero the gradients of pruned weights
    optimizer.step()
    acdc.step()                    # re-zero pruned weights, advance the schedule, switch phase if due

Phases (AC/DC, Peste et al., NeurIPS 2021): a dense warm-up; compressed and decompressed phases alternating; one longer
decompressed phase; a final compressed phase. Entering a compressed phase prunes to the target sparsity by
global magnitude (top-k of |w| over all prunable weights); while compressed, gradients of pruned weights
are masked before the step and pruned weights are re-zeroed after it (an optimizer with momentum or weight
decay would otherwise move them). Entering a decompressed phase lifts the masks; pruned weights restart
from exactly 0. ``reset_moments`` decides whether the optimizer's per-entry state (Adam's exp_avg /
exp_avg_sq, SGD's momentum buffer: every state tensor shaped like the parameter) of the pruned entries is
zeroed at decompression (True) or kept (False; during the compressed phase it has only decayed, since
the masked gradients were zero).

Multiplicative optimizers (HORST, HAM): their mirror step ``w <- w * exp(...)`` maps 0 to 0, so it can
neither revive nor move a pruned weight; only their additive part can. HORST's first half is AdamW's
update, so at decompression a pruned weight regrows from 0 by the Adam step ``-u`` and the mirror step then
scales it by ``exp(alpha |u|) >= 1`` (the sign of the new weight is that of ``-u``), i.e. regrowth is AdamW's
plus a relative boost of order ``alpha * lr``. HAM regrows through the wrapped optimizer's step in the same
way. A purely multiplicative update (mirror descent alone) could never regrow: decompression would then be a
no-op and AC/DC would reduce to gradual magnitude pruning. With ``reset_moments=True`` the regrowth of a
weight starts from fresh moments, so its first Adam steps are ``~lr * sign(g) * (1-b1)/sqrt(1-b2)``.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.sparsity.masks import Selection, compute_masks, select_prunable
from descentlab.sparsity.report import SparsityReport, sparsity_report
from descentlab.sparsity.sharded import full_mask, local_part, local_rows

__all__ = ["ACDC", "ACDCSchedule", "Phase", "acdc_phases"]

# The reference schedule of AC/DC (Peste et al., NeurIPS 2021) for a 100-epoch run, as fractions of the run length.
REFERENCE_FRACTIONS = {"warmup": 0.10, "phase": 0.05, "last_decompressed": 0.10, "final": 0.15}


@dataclass(frozen=True)
class Phase:
    """One phase: ``kind`` in {"dense", "compressed", "decompressed"} over optimizer steps [start, end)."""

    kind: str
    start: int
    end: int


def acdc_phases(total: int, warmup: int, phase: int, last_decompressed: int, final: int) -> list[Phase]:
    """The AC/DC phase list over ``total`` optimizer steps.

    Layout: dense [0, warmup); then compressed / decompressed phases of ``phase`` steps, alternating and
    starting compressed, up to ``total - last_decompressed - final`` (the last one may be shorter);
    decompressed for ``last_decompressed`` steps; compressed for the last ``final`` steps. Adjacent phases
    of the same kind are merged. Steps past ``total`` belong to the last phase.

    Raises:
        ConfigError: if the lengths do not fit into ``total`` or ``phase < 1``.
    """
    if min(total, phase) < 1 or min(warmup, last_decompressed, final) < 0:
        raise ConfigError(f"AC/DC needs total, phase >= 1 and other lengths >= 0; got {total=}, {phase=}")
    end_alt = total - last_decompressed - final
    if warmup > end_alt:
        raise ConfigError(
            f"AC/DC warm-up {warmup} + last decompressed {last_decompressed} + final {final} steps exceed "
            f"the run of {total} steps; shorten them or train longer."
        )
    raw: list[Phase] = []
    if warmup:
        raw.append(Phase("dense", 0, warmup))
    start, kind = warmup, "compressed"
    while start < end_alt:
        end = min(start + phase, end_alt)
        raw.append(Phase(kind, start, end))
        kind = "decompressed" if kind == "compressed" else "compressed"
        start = end
    if last_decompressed:
        raw.append(Phase("decompressed", end_alt, end_alt + last_decompressed))
    if final:
        raw.append(Phase("compressed", total - final, total))
    merged: list[Phase] = []
    for p in raw:
        if merged and merged[-1].kind == p.kind:
            merged[-1] = Phase(p.kind, merged[-1].start, p.end)
        else:
            merged.append(p)
    return merged


@dataclass
class ACDCSchedule:
    """AC/DC phase lengths, in steps or epochs.

    Any length left None is the reference schedule of AC/DC (100 epochs: warm-up 10, phases of 5
    until epoch 75, a decompressed phase of 10, a final compressed phase of 15) scaled to ``total``.

    Attributes:
        total: Run length in ``unit`` (None: the ``total_steps`` given to :class:`ACDC`).
        unit: "steps" or "epochs".
        steps_per_epoch: Needed when ``unit == "epochs"``.
        warmup: Dense warm-up length.
        phase: Length of each alternating phase (at least one step after conversion).
        last_decompressed: Length of the decompressed phase before the final compressed one.
        final: Length of the final compressed fine-tuning phase.
    """

    total: float | None = None
    unit: str = "steps"
    steps_per_epoch: int | None = None
    warmup: float | None = None
    phase: float | None = None
    last_decompressed: float | None = None
    final: float | None = None

    def __post_init__(self) -> None:
        if self.unit not in ("steps", "epochs"):
            raise ConfigError(f"ACDCSchedule.unit must be 'steps' or 'epochs', got {self.unit!r}")
        if self.unit == "epochs" and not self.steps_per_epoch:
            raise ConfigError("ACDCSchedule(unit='epochs') needs steps_per_epoch (len(loader) per process)")
        for name in ("total", "warmup", "phase", "last_decompressed", "final"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"ACDCSchedule.{name} must be >= 0, got {value}")

    def _to_steps(self, value: float) -> int:
        scale = self.steps_per_epoch if self.unit == "epochs" else 1
        return round(value * scale)

    def phases(self, total_steps: int | None = None) -> list[Phase]:
        """The phase list; ``total_steps`` is used when ``total`` is None."""
        if self.total is not None:
            total = self._to_steps(self.total)
            total_units = self.total
        elif total_steps is not None:
            total = int(total_steps)
            total_units = total / (self.steps_per_epoch if self.unit == "epochs" else 1)
        else:
            raise ConfigError(
                "AC/DC needs the run length: set ACDCSchedule(total=...) or ACDC(total_steps=...)"
            )
        lengths = {}
        for name, fraction in REFERENCE_FRACTIONS.items():
            value = getattr(self, name)
            lengths[name] = self._to_steps(value if value is not None else fraction * total_units)
        lengths["phase"] = max(1, lengths["phase"])
        return acdc_phases(total, **lengths)


class ACDC:
    """AC/DC sparse-training controller (masks in controller state, model untouched).

    Args:
        model: The model whose prunable weights are controlled.
        optimizer: The optimizer stepping ``model`` (any ``torch.optim.Optimizer``; wrappers exposing the
            wrapped one as ``.optimizer`` / ``.base_optimizer`` are searched too when moments are reset).
        sparsity: Target fraction of zeros over the selected weights in compressed phases, in [0, 1).
        schedule: Phase lengths; default = the reference schedule scaled to ``total_steps``.
        total_steps: Run length in optimizer steps, when ``schedule.total`` is None.
        scope: "global" (one magnitude threshold over all selected weights, as AC/DC), "layer" or "nm".
        select: Which weights (default: Linear / Conv1D weights inside the transformer blocks).
        reset_moments: At decompression, zero the optimizer state entries of the pruned weights (True) or
            keep them (False).
        nm: (N, M) when ``scope == "nm"``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        sparsity: float = 0.9,
        schedule: ACDCSchedule | None = None,
        *,
        total_steps: int | None = None,
        scope: str = "global",
        select: Selection | None = None,
        reset_moments: bool = False,
        nm: tuple[int, int] = (2, 4),
    ) -> None:
        if not 0.0 <= float(sparsity) < 1.0:
            raise ConfigError(f"ACDC sparsity must lie in [0, 1), got {sparsity}; e.g. 0.9 for 90 % zeros.")
        if scope not in ("global", "layer", "nm"):
            raise ConfigError(f"unknown ACDC scope {scope!r}; use 'global', 'layer' or 'nm'.")
        self.model = model
        self.optimizer = optimizer
        self.sparsity = float(sparsity)
        self.schedule = schedule or ACDCSchedule()
        self.scope = scope
        self.select = select
        self.reset_moments = bool(reset_moments)
        self.nm = tuple(nm)
        self.tensors = select_prunable(model, select)
        self.phases = self.schedule.phases(total_steps)
        _check_ends_sparse(self.phases, self.schedule)
        self._starts = [p.start for p in self.phases]
        self.step_count = 0
        self._phase_index = self._index_at(0)
        self._masks: dict[str, torch.Tensor] | None = None
        self._pruned: dict[str, torch.Tensor] = {}
        if self.phase.kind == "compressed":
            self._compress()

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        """The phase of the next optimizer step."""
        return self.phases[self._phase_index]

    @property
    def compressed(self) -> bool:
        return self._masks is not None

    @property
    def masks(self) -> dict[str, torch.Tensor] | None:
        """Parameter name -> keep-mask (True = kept) while compressed, else None."""
        return self._masks

    def report(self) -> SparsityReport:
        """Exact zeros of the controlled weights now."""
        return sparsity_report(self.model, self.select)

    def _index_at(self, step: int) -> int:
        return max(0, bisect.bisect_right(self._starts, step) - 1)

    # -- per-step hooks --------------------------------------------------------------------------------
    @torch.no_grad()
    def mask_grads_(self) -> None:
        """Zero the gradients of pruned weights (call after backward, before ``optimizer.step()``)."""
        if self._masks is None:
            return
        for t in self.tensors:
            if t.param.grad is not None:
                local_part(t.param.grad).masked_fill_(self._pruned[t.name], 0)

    def before_optimizer_step(self) -> None:
        """The training loop's pre-step hook: same as :meth:`mask_grads_`."""
        self.mask_grads_()

    @torch.no_grad()
    def step(self) -> None:
        """After ``optimizer.step()``: re-zero pruned weights, advance one step, switch phase if due."""
        if self._masks is not None:
            self._zero_pruned_()
        self.step_count += 1
        new_index = self._index_at(self.step_count)
        if new_index == self._phase_index:
            return
        self._phase_index = new_index
        if self.phase.kind == "compressed":
            self._compress()
        elif self._masks is not None:
            self._decompress()

    # -- transitions -----------------------------------------------------------------------------------
    def _set_masks(self, masks: dict[str, torch.Tensor] | None) -> None:
        self._masks = masks
        self._pruned = {} if masks is None else {name: ~m for name, m in masks.items()}

    @torch.no_grad()
    def _zero_pruned_(self) -> None:
        for t in self.tensors:
            local_part(t.param).masked_fill_(self._pruned[t.name], 0)

    def _compress(self) -> None:
        self._set_masks(compute_masks(self.tensors, self.sparsity, self.scope, self.nm))
        self._zero_pruned_()

    @torch.no_grad()
    def _decompress(self) -> None:
        if self.reset_moments:
            for t in self.tensors:
                for state in _states_of(self.optimizer, t.param):
                    for value in state.values():
                        if torch.is_tensor(value) and value.shape == t.param.shape:
                            local_part(value).masked_fill_(self._pruned[t.name], 0)
        self._set_masks(None)

    # -- checkpointing ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Step, settings, phase list and current masks (bool tensors on CPU); torch.load-safe.

        Under FSDP2 the masks held are the local shards'; the state dict holds the whole masks (gathered,
        so every rank must call it), the same state dict one process would save.
        """
        masks = None
        if self._masks is not None:
            by_name = {t.name: t.param for t in self.tensors}
            masks = {k: full_mask(v, by_name[k]).detach().cpu().clone() for k, v in self._masks.items()}
        return {
            "step_count": self.step_count,
            "sparsity": self.sparsity,
            "scope": self.scope,
            "reset_moments": self.reset_moments,
            "schedule": asdict(self.schedule),
            "phases": [[p.kind, p.start, p.end] for p in self.phases],
            "masks": masks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore step and masks; re-applies the masks to the weights so both agree exactly.

        Raises:
            ConfigError: if the saved phase list or sparsity differ from this controller's.
        """
        saved = [tuple(p) for p in state["phases"]]
        if saved != [(p.kind, p.start, p.end) for p in self.phases] or state["sparsity"] != self.sparsity:
            raise ConfigError(
                "the AC/DC checkpoint was made with another schedule or sparsity; build ACDC with the same "
                "settings as the run being resumed."
            )
        self.step_count = int(state["step_count"])
        self._phase_index = self._index_at(self.step_count)
        masks = state["masks"]
        if masks is None:
            self._set_masks(None)
            return
        by_name = {t.name: t.param for t in self.tensors}
        missing = set(by_name) ^ set(masks)
        if missing:
            raise ConfigError(
                f"AC/DC checkpoint masks do not match the model's prunable weights: {sorted(missing)[:3]}"
            )
        self._set_masks(
            {
                k: local_rows(masks[k], by_name[k]).to(device=local_part(by_name[k]).device, dtype=torch.bool)
                for k in by_name
            }
        )
        self._zero_pruned_()

    def __repr__(self) -> str:
        p = self.phase
        masked = len(self._masks) if self._masks is not None else 0
        return (
            f"ACDC(sparsity={self.sparsity:g}, scope={self.scope!r}, phase={p.kind!r} [{p.start}, {p.end}), "
            f"step={self.step_count}/{self.phases[-1].end}, masked={masked}/{len(self.tensors)} tensors)"
        )


def _ends_compressed(schedule: ACDCSchedule, total_steps: int) -> bool:
    try:
        return schedule.phases(total_steps)[-1].kind == "compressed"
    except ConfigError:  # lengths that do not fit this run
        return False


def _check_ends_sparse(phases: list[Phase], schedule: ACDCSchedule, search_up_to: int = 10_000) -> None:
    """Refuse a schedule whose last phase is not compressed: the run would end dense, every mask lifted.

    That happens when the run is too short for the lengths to round to a final phase (``total_steps=2``
    of the reference schedule: compressed [0, 1), decompressed [1, 2)), or when ``final=0``. The message
    names the smallest ``total_steps`` that ends compressed with this schedule, when one exists.
    """
    last = phases[-1]
    if last.kind == "compressed":
        return
    total = last.end
    fix = "give it a final compressed phase: ACDCSchedule(final=...) of at least 1 step"
    if schedule.total is None:
        minimum = next((t for t in range(total + 1, search_up_to) if _ends_compressed(schedule, t)), None)
        if minimum is not None:
            fix = f"AC/DC needs total_steps >= {minimum} with this schedule (or {fix})"
    raise ConfigError(
        f"this AC/DC schedule over {total} steps ends in a {last.kind} phase [{last.start}, {last.end}): the "
        f"run would end dense, no weight masked; {fix}"
    )


def _states_of(optimizer: Any, param: torch.Tensor) -> list[dict]:
    """Per-parameter state dicts of ``optimizer`` and of optimizers it wraps (``.optimizer`` or
    ``.base_optimizer``), each state dict once (wrappers often share their base's state)."""
    found: dict[int, dict] = {}
    todo, seen = [optimizer], set()
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        state = getattr(current, "state", None)
        if isinstance(state, dict) and param in state:
            found.setdefault(id(state[param]), state[param])
        todo += [getattr(current, "optimizer", None), getattr(current, "base_optimizer", None)]
    return list(found.values())
