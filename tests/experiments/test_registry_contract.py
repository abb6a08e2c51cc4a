"""The registry's contract, checked per study and preset in the manner of timm's optimizer tests: every
study of ``experiments.REGISTRY`` x every preset (and its defaults)

* resolves its config;
* builds its design record, ``config.design(cfg)``: the arms, conditions and seeds the run will measure;
* has every declared claim, on synthetic arrays of exactly that design's shape (seeds x examples, a small
  examples count where the preset's is huge) saved the way the study saves them, either judged or raise
  ``NotInRun`` naming what the design lacks (or yield no comparison, the engine's other way to say "not
  in this run"): never ``MissingArrays`` (or any other ``KeyError``: a pending row), never another
  exception;
* at the ``full`` and ``paper`` presets, judges its primary endpoint (never "not in this run") on at least
  3 seeds;
* has a committed run (``docs/results/<study>``) whose report, tables and figures ``descentlab report``
  rebuilds from the files the run saved.

The fillers below write what each study's run saves (the cell store keyed ``metric/arm/condition``, and
the design record's measured ``extra``), from the design alone: a claim that reads something the design
does not fix fails here. The studies whose tests keep a tiny override list also run it end to end through
the runner, which writes the config's design record before the run; the run's store must then save under
it (``CellStore.save`` refuses other arms, conditions or seeds).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from descentlab.config import resolve_config
from descentlab.errors import AssetMissingError
from descentlab.experiments import REGISTRY, get, report_run, run_experiment
from descentlab.report.claims import NOT_IN_RUN, PENDING, NotInRun, judge
from descentlab.study.cells import DESIGN_FILE, CellStore, Design, record_design

EXAMPLES = 24  # examples per cell where the design leaves the count to the run (the presets cap it)
MAX_EXAMPLES = 256  # where the preset fixes a huge count (50,000 ImageNet images), a smaller one
JUDGING = ("full", "paper")  # the presets whose primary endpoint must be judged
MIN_SEEDS = 3
LAYERS = 4  # per-layer axes (loss read out at each layer) in the synthetic arrays
Filler = Callable[[Any, Design, Path, np.random.Generator], None]


def _cases() -> list[Any]:
    return [
        pytest.param(name, preset, id=f"{name}-{preset or 'defaults'}")
        for name in REGISTRY
        for preset in [None, *get(name).presets]
    ]


def _save(design: Design, arrays: dict[str, np.ndarray], run_dir: Path) -> None:
    CellStore(design, arrays).save(run_dir)  # checked against the record the runner wrote


def _bernoulli(rng: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    return (rng.random(shape) < p).astype(np.float32)


def fill_robust_sparse(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``correct/<method>/<s>``: 0/1 ``[seed, draw, γ, example]``."""
    shape = (len(design.seeds), cfg.evaluation.draws, len(design.extra["gammas"]), design.examples)
    arrays = {
        f"correct/{arm}/{s}": _bernoulli(rng, shape, rng.uniform(0.6, 0.9)).astype(np.uint8)
        for arm in design.arms
        for s in design.conditions
    }
    _save(design, arrays, run_dir)


def fill_text_robustness(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``correct/<method>/<kind>`` ``[seed, draw, γ, example]``, ``loss/<method>`` ``[seed, L+1, example]``,
    and ERM's validation profile (measured on the tuning seed)."""
    seeds, examples = len(design.seeds), design.examples
    shape = (seeds, cfg.evaluation.draws, len(design.extra["gammas"]), examples)
    arrays = {f"correct/{m}/{k}": _bernoulli(rng, shape, 0.8) for m in design.arms for k in design.conditions}
    arrays |= {f"loss/{m}": rng.gamma(2.0, 0.3, (seeds, LAYERS + 1, examples)) for m in design.arms}
    profile = [1.0, 0.8, 0.9, 0.5, 0.4][: LAYERS + 1]  # rises once: the monotone claim is testable
    _save(replace(design, extra={**design.extra, "erm_val_profile": profile}), arrays, run_dir)


def fill_sparse_lm(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``nll/<method>/<level>`` ``[seed, block]``, ``frac_below/<method>`` and ``kurtosis/<method>``
    ``[seed, matrix]``, and with tuning the tuning runs' validation grid."""
    seeds, examples = len(design.seeds), design.examples
    arrays = {
        f"nll/{m}/{p}": rng.normal(4.0 + 2 * float(p), 0.2, (seeds, examples))
        for m in design.arms
        for p in design.conditions
    }
    for m in design.arms:
        arrays[f"frac_below/{m}"] = rng.uniform(0.0, 0.1, (seeds, 8))
        arrays[f"kurtosis/{m}"] = rng.normal(3.0, 1.0, (seeds, 8))
    extra = dict(design.extra)
    if cfg.tune:
        labels = [m for m in design.arms for _ in range(4)]
        extra["grid"] = {
            "val_nll": rng.normal(4.0, 0.2, (len(labels), len(design.conditions))).tolist(),
            "label": labels,
            "weight_decay": [[0.1, 0.5][i % 2] for i in range(len(labels))],
        }
    _save(replace(design, extra=extra), arrays, run_dir)


def fill_implicit_bias(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """Per-seed scalars of the main problems, Theorem 4.7's paths ``[seed, step]`` (with the steps they were
    recorded at) and the scale study's ratio per spread."""
    seeds = len(design.seeds)
    arrays = {
        f"{metric}/{m}": rng.uniform(0.5, 1.0, seeds)
        for m in cfg.methods
        for metric in ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio")
    }
    extra = dict(design.extra)
    if cfg.theorem.methods:
        steps = np.unique(np.geomspace(1, cfg.theorem.steps, cfg.theorem.points).round()).tolist()
        extra["theorem"] = {**extra["theorem"], "steps": steps}
        arrays |= {
            f"theorem_ratio/{m}": rng.uniform(0.8, 1.0, (seeds, len(steps))) for m in cfg.theorem.methods
        }
    arrays |= {
        f"scales_l1_margin_ratio/{m}/{k}": rng.uniform(0.5, 1.0, seeds)
        for m in cfg.scales.methods
        for k in design.conditions
    }
    _save(replace(design, extra=extra), arrays, run_dir)


def fill_video_denoising(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``mse/<arm>`` ``[seed, γ, sequence]`` of every arm and ``layer_mse/<arm>`` ``[seed, L+1, sequence]`` of
    every learned one; a budget-curve point has the first seed only."""
    learned, baselines = design.extra["methods"], design.extra["baselines"]
    gammas = len(design.extra["gammas"])
    arrays = {}
    for arm in design.arms:
        seeds = len(design.seeds) if arm in learned or arm in baselines else 1
        arrays[f"mse/{arm}"] = rng.gamma(4.0, 0.002, (seeds, gammas, design.examples))
        if arm not in baselines:
            arrays[f"layer_mse/{arm}"] = rng.gamma(4.0, 0.002, (seeds, LAYERS + 1, design.examples))
    _save(design, arrays, run_dir)


def fill_llm_robustness(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``win/<arm>/<condition>`` ``[seed, draw, example]`` against ERM of the same seed (ERM's own: 1/2),
    and ERM's noise level and perplexity growth per condition."""
    seeds, shape = len(design.seeds), (len(design.seeds), cfg.grid.draws, design.examples)
    arrays = {}
    for c in design.conditions:
        for arm in design.arms:
            arrays[f"win/{arm}/{c}"] = (
                np.full(shape, 0.5) if arm == cfg.baseline else rng.choice([0.0, 0.5, 1.0], shape)
            )
        arrays[f"level/{cfg.baseline}/{c}"] = np.full(seeds, 0.0 if c == "clean" else 1.0)
        arrays[f"perplexity_ratio/{cfg.baseline}/{c}"] = rng.uniform(1.0, 3.0, seeds)
    _save(design, arrays, run_dir)


def fill_regime_map(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``nll/<arm>/<size>@<p>`` of the HORST sweep and ``noisy/<arm>/L<depth>`` of the constrained one, each
    ``[seed, example]``, and the parameter count of every size."""
    seeds, examples = len(design.seeds), design.examples
    horst, constrained = (
        [a for a in ("adamw", "horst") if a in design.arms],
        [a for a in ("erm", "constrained") if a in design.arms],
    )
    arrays = {}
    for c in design.conditions:
        for arm in horst if "@" in c else constrained:
            metric = "nll" if "@" in c else "noisy"
            arrays[f"{metric}/{arm}/{c}"] = rng.normal(4.0, 0.3, (seeds, examples))
    params = {size: 10 ** (5 + i) for i, size in enumerate(design.extra.get("sizes", []))}
    _save(replace(design, extra={**design.extra, "params": params}), arrays, run_dir)


def fill_sparse_vit(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """``correct/<method>/<p>`` ``[seed, image]`` of every method at every sparsity, of the dense arm at
    ``dense`` and of the paper-like arm at ``paper-like`` (its own seeds), and ``frac_below`` / ``kurtosis``
    ``[seed, tensor]`` of every method at the claim sparsity."""
    store = CellStore(design)
    for p in cfg.sparsities:
        for m in cfg.methods:
            store.put("correct", m, p, _bernoulli(rng, (len(design.seeds), design.examples), 0.8))
    for stat in ("frac_below", "kurtosis") if cfg.claim_sparsity in cfg.sparsities else ():
        for m in cfg.methods:
            store.put(stat, m, cfg.claim_sparsity, rng.uniform(0.0, 4.0, (len(design.seeds), 8)))
    for condition, arms in (("dense", [cfg.dense] if cfg.dense else []), ("paper-like", ["adamw", "horst"])):
        if condition in design.conditions:
            for m in arms:
                shape = (len(design.seeds_at(condition)), design.examples)
                store.put("correct", m, condition, _bernoulli(rng, shape, 0.8))
    store.save(run_dir)


def fill_nothing(cfg: Any, design: Design, run_dir: Path, rng: np.random.Generator) -> None:
    """A study that judges no claim (smoke) saves no cells."""


FILLERS: dict[str, Filler] = {
    "robust-sparse": fill_robust_sparse,
    "text-robustness": fill_text_robustness,
    "sparse-lm": fill_sparse_lm,
    "implicit-bias": fill_implicit_bias,
    "video-denoising": fill_video_denoising,
    "llm-robustness": fill_llm_robustness,
    "regime-map": fill_regime_map,
    "sparse-vit": fill_sparse_vit,
    "smoke": fill_nothing,
}


def test_every_registered_study_has_a_filler() -> None:
    assert sorted(FILLERS) == sorted(REGISTRY), "a new study needs its filler here: what its run saves"


@pytest.mark.parametrize(("study", "preset"), _cases())
def test_a_preset_designs_its_run_and_every_claim_reaches_its_cells(study: str, preset: str | None, tmp_path):
    exp = get(study)
    cfg = resolve_config(exp.config_cls, preset=preset, presets=exp.presets)
    design = exp.design(cfg)
    assert isinstance(design, Design), f"{study}: config.py defines no design(cfg) -> Design"
    assert design.arms and design.seeds, f"{study} {preset}: a design measures arms on seeds, got {design}"

    # what the runner writes before the run, then what the run saves (a store must match the record)
    record_design(tmp_path, design)
    examples = EXAMPLES if design.examples is None else min(design.examples, MAX_EXAMPLES)
    FILLERS[study](cfg, replace(design, examples=examples), tmp_path, np.random.default_rng(0))
    arrays = exp.claim_arrays(tmp_path)

    for spec in exp.claims:
        try:
            list(spec.cells(arrays))
        except NotInRun as exc:
            assert str(exc).strip(), f"{spec.name}: NotInRun must name what the design lacks"
        except KeyError as exc:  # MissingArrays included: the row would pend on a run of this very design
            pytest.fail(f"{study} {preset}: claim {spec.name} pends on arrays of its own design: {exc}")
    rows = judge(exp.claims, arrays) if exp.claims else []
    assert [r.name for r in rows if r.verdict == PENDING] == []

    if preset in JUDGING and exp.claims:
        (primary,) = {r.name for r in rows if r.role == "primary"}
        judged = [r for r in rows if r.name == primary]
        assert all(r.verdict != NOT_IN_RUN for r in judged), (
            f"{study} {preset}: the primary endpoint {primary} is not in this run: {judged[0].reason}"
        )
        assert all((r.seeds or 0) >= MIN_SEEDS for r in judged), (
            f"{study} {preset}: the primary endpoint {primary} is judged on {judged[0].seeds} seed(s), "
            f"fewer than {MIN_SEEDS}"
        )


# --- quick paths through the runner: the config's design record, then the run's store under it ---------


def tiny_overrides(test_file: str, name: str = "TINY") -> list[str]:
    """The tiny override list a study's own tests run it with (read from that file, not copied)."""
    tree = ast.parse((Path(__file__).parent / test_file).read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]
    ]
    return list(ast.literal_eval(value))


# study -> (its tests' tiny overrides, what this check adds to keep it under 20 s on one core)
QUICK = {
    "smoke": ("test_smoke.py", []),
    "implicit-bias": ("test_implicit_bias.py", []),
    "sparse-lm": ("test_sparse_lm.py", ["seeds=[0,1]", "methods=[adamw,horst]"]),
}


@pytest.mark.parametrize("study", list(QUICK))
def test_a_quick_run_saves_under_the_design_record_its_config_declared(study: str, tmp_path) -> None:
    test_file, extra = QUICK[study]
    overrides = [*tiny_overrides(test_file), *extra]
    try:
        run_dir = run_experiment(study, overrides=overrides, out=tmp_path)
    except AssetMissingError as exc:
        pytest.skip(f"{study}: an offline asset is missing: {exc}")
    exp = get(study)
    design = exp.design(resolve_config(exp.config_cls, overrides=overrides))
    # the runner wrote the config's record; a store saved by the run had to match it (else save raises)
    saved = CellStore.load(run_dir).design
    assert (set(saved.arms), set(saved.conditions), saved.seeds) == (
        set(design.arms),
        set(design.conditions),
        design.seeds,
    )
    assert saved.extra.items() >= {k: v for k, v in design.extra.items() if k != "theorem"}.items()
    if exp.claims:
        assert saved.examples is not None  # the run adds what it measured
        rows = json.loads((run_dir / "results.json").read_text())["claims"]
        assert rows and [r["name"] for r in rows if r["verdict"] == PENDING] == []
    else:
        assert json.loads((run_dir / DESIGN_FILE).read_text()) == design.to_dict()


# --- every committed run: its report and figures are rebuilt from what the run saved ---------------------

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
COMMITTED = sorted(p.parent.name for p in RESULTS.glob("*/results.json"))
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
PNG = b"\x89PNG\r\n\x1a\n"


def test_every_study_with_claims_has_a_committed_run_to_rebuild() -> None:
    assert sorted(name for name in REGISTRY if get(name).claims) == COMMITTED


@pytest.mark.parametrize("study", COMMITTED)
def test_a_committed_run_rebuilds_its_report_and_figures_from_its_saved_files(study: str, tmp_path) -> None:
    source = RESULTS / study
    companions = [p.parent.name for p in source.glob("*/results.json")]  # runs of their own
    copy = tmp_path / study
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.png", *companions))
    with warnings.catch_warnings():
        # a committed run leaves its weights files out: the studies that draw them say so and skip them
        warnings.filterwarnings("ignore", message=".*weights files missing")
        report = report_run(copy).read_text()
    results = json.loads((copy / "results.json").read_text())
    figures = IMAGE.findall(report)
    assert figures, f"{study}: the rebuilt report shows no figure"
    for rel in figures:
        assert (copy / rel).read_bytes()[:8] == PNG, f"{study}: {rel} was not drawn"
    for table in results.get("tables", []):
        assert table["title"] in report, f"{study}: table {table['title']!r} missing from the report"
    assert "Primary endpoint" in report


RUN_CALL = re.compile(r'run_experiment\(\s*"([a-z-]+)"')


def test_every_study_is_run_end_to_end_by_a_test() -> None:
    """The quick paths above run three studies; each other study's own test module runs it through the
    runner on a tiny config (its offline assets come from that module's fixtures)."""
    called = {m for f in Path(__file__).parent.glob("test_*.py") for m in RUN_CALL.findall(f.read_text())}
    assert sorted(set(REGISTRY) - called - set(QUICK)) == []
