"""Check the per-layer readout on a tiny random model of every Hugging Face family; write the family table.

    .venv/bin/python scripts/readout_families.py [--out docs/readout-families.md]

For each family of ``tests/tiny_models.FAMILIES`` (built offline from a transformers config, float32):

* f_L = ``layer_losses(model, batch)[-1]`` against the model's own loss (``model(**batch, labels=...).loss``);
* f_l, l < L, against the model truncated after layer l (its block list cut, its own head and loss
  unchanged): that model's loss is exactly what layer l's readout must give, so this checks the final norm
  is applied once to each layer;
* what the structural trace found (block list, final transform, pooler).

``tests/readout/test_hf_families.py`` runs :func:`check_family` for every family, asserts both tolerances
and writes the table with :func:`write_table`, so the page is always generated from real results.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
DOC = ROOT / "docs" / "readout-families.md"


def _families():
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import tiny_models

    return tiny_models


@dataclasses.dataclass
class FamilyResult:
    """One row of the family table."""

    family: str
    kind: str
    model_class: str
    transformers_version: str
    structure: str
    own_loss_error: float  # |f_L - model's own loss|
    truncated_error: float  # max over l < L of |f_l - loss of the model cut after layer l|
    error: str = ""  # the readout's error message when it does not support the family
    compared_layers: tuple[int, ...] = ()  # the l < L with a cut twin (a 0-layer model may not run)

    @property
    def matches(self) -> bool:
        return not self.error and self.own_loss_error <= TOLERANCE

    @property
    def layers_match(self) -> bool:
        return not self.error and self.truncated_error <= TOLERANCE


def _own_loss(model: nn.Module, batch: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    if kind == "lm":
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return model(**batch, labels=labels).loss
    return model(**batch).loss


def truncated(model: nn.Module, blocks: str, keep: int) -> nn.Module:
    """A copy of ``model`` that ends after layer ``keep``: its backbone's block list cut, nothing else changed.

    A shared block list (ALBERT: one group run L times) is kept whole; the layer count in the config decides.
    """
    cut = copy.deepcopy(model)
    base = cut.base_model
    owner_path, _, name = blocks.rpartition(".")
    owner = base.get_submodule(owner_path) if owner_path else base
    layers = getattr(owner, name)
    total = cut.config.num_hidden_layers
    if len(layers) == total:
        setattr(owner, name, nn.ModuleList(list(layers)[:keep]))
    for key in ("num_hidden_layers", "n_layer", "n_layers"):
        if key in cut.config.to_dict() or hasattr(cut.config, key):
            with contextlib.suppress(AttributeError):
                setattr(cut.config, key, keep)
    if isinstance(getattr(cut.config, "layer_types", None), list):
        cut.config.layer_types = cut.config.layer_types[:keep]
    return cut


def check_family(name: str) -> FamilyResult:
    """Build the family's tiny model, read its layers out and compare with its own and truncated losses."""
    import transformers

    from descentlab.errors import ModelError
    from descentlab.readout import layer_losses
    from descentlab.readout.structure import _PLANS

    tiny = _families()
    kind = tiny.FAMILIES[name][0]
    model = tiny.tiny_family(name)
    batch = tiny.family_batch(name)
    row = FamilyResult(
        name, kind, type(model).__name__, transformers.__version__, "", float("nan"), float("nan")
    )
    try:
        with torch.no_grad():
            f = layer_losses(model, batch)
    except ModelError as exc:
        row.error = str(exc)
        return row
    plan = _PLANS[model.base_model]
    row.structure = plan.describe()
    with torch.no_grad():
        row.own_loss_error = float((f[-1] - _own_loss(model, batch, kind)).abs())
        errors = {}
        for keep in range(len(f) - 1):
            try:
                cut_loss = _own_loss(truncated(model, plan.blocks, keep), batch, kind)
            except Exception:
                if keep == 0:
                    continue
                raise
            errors[keep] = float((f[keep] - cut_loss).abs())
    row.truncated_error = max(errors.values())
    row.compared_layers = tuple(errors)
    return row


def family_names() -> list[str]:
    return list(_families().FAMILIES)


def render_table(rows: list[FamilyResult]) -> str:
    kinds = {"text": "sequence classifier", "lm": "causal LM", "image": "image classifier"}
    version = rows[0].transformers_version if rows else "?"
    ok = sum(r.matches and r.layers_match for r in rows)
    lines = [
        "# Per-layer readout: the family table",
        "",
        "Generated by `tests/readout/test_hf_families.py` (or `.venv/bin/python scripts/readout_families.py`)"
        " from real results; do not edit by hand.",
        "",
        f"Each family is a tiny random model built offline from its transformers {version} config (2 layers, "
        "width 32, float32, eval mode). `f_L = own loss`: |layer_losses(model, batch)[-1] - model(**batch).loss|"
        f" <= {TOLERANCE:g}. `f_l = cut model`: for every l < L (l = 0 where a 0-layer model runs), f_l equals the loss of the same model cut "
        "after layer l (its block list shortened, its head and loss unchanged), so the final norm is applied "
        "exactly once per layer. *Structure* is what `descentlab.readout.structure.trace_backbone` found in "
        "the model (no list of known classes is consulted).",
        "",
        f"{ok} of {len(rows)} families read out exactly.",
        "",
        "| family | kind | task model | f_L = own loss | abs. error | f_l = cut model | layers l | abs. error "
        "| structure found |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(
                f"| {r.family} | {kinds[r.kind]} | `{r.model_class}` | no | - | no | - | - | error: {r.error} |"
            )
            continue
        lines.append(
            f"| {r.family} | {kinds[r.kind]} | `{r.model_class}` | {'yes' if r.matches else 'NO'} | "
            f"{r.own_loss_error:.1e} | {'yes' if r.layers_match else 'NO'} | "
            f"{', '.join(map(str, r.compared_layers))} | {r.truncated_error:.1e} | "
            f"{r.structure} |"
        )
    lines += [
        "",
        "Any other `*ForSequenceClassification`, `*ForCausalLM` or `*ForImageClassification` whose backbone "
        "returns L+1 hidden states is handled the same way; one whose final transform or pooler is not a "
        "chain of sub-modules gets a `ModelError` naming the missing piece (then pass "
        "`layer_losses(model, batch, readout=fn)` or `register_readout(...)`). See "
        "[constrained.md](constrained.md), section *Readouts*.",
        "",
    ]
    return "\n".join(lines)


def write_table(rows: list[FamilyResult], path: Path = DOC) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render_table(rows))
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [check_family(name) for name in family_names()]
    print(write_table(rows, args.out))
    return 0 if all(r.matches and r.layers_match for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
