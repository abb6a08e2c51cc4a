"""docs/paper-scale.md is generated from the ``paper`` presets: the committed page must be what the presets
give today, and every package a preset needs must be in the ``paper`` extra of pyproject.toml."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from descentlab.config import resolve_config
from descentlab.experiments import get, paper_cost, paper_scale

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "paper-scale.md"
RESULTS = ROOT / "docs" / "results"


def paper_extra() -> set[str]:
    """The distribution names of pyproject's ``paper`` extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["paper"]
    return {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower() for req in extra}


def test_the_committed_page_is_what_the_presets_generate(tmp_path) -> None:
    assert PAGE.read_text() == paper_scale.render(RESULTS), (
        "docs/paper-scale.md is stale: python -m descentlab.experiments.paper_scale docs/paper-scale.md"
    )
    # --check says so too, and writes nothing
    stale = tmp_path / "paper-scale.md"
    stale.write_text(PAGE.read_text().replace("(5)", "(1)"))
    check = [str(stale), "--check", "--results", str(RESULTS)]
    assert paper_scale.main(check) == 1 and "(1)" in stale.read_text()
    assert paper_scale.main(check[:1] + check[2:]) == 0 and paper_scale.main(check) == 0


def test_the_page_reads_each_preset() -> None:
    # one value of each study's section, from its config, so a section cannot show another study's preset
    for study in paper_scale.STUDIES:
        cfg = paper_scale.paper_config(study)
        part = paper_scale.section(study, RESULTS)
        assert part.startswith(f"## {study}\n")
        assert f"| evaluation seeds | {cfg.seeds} ({len(cfg.seeds)}) |" in part
        assert f"| tuning seed | {cfg.tune_seed} " in part and cfg.tune_seed not in cfg.seeds
        assert all(f"`{m}`" in part for m in cfg.methods)


@pytest.mark.parametrize("study", paper_scale.STUDIES)
def test_every_package_a_paper_preset_needs_is_in_the_paper_extra(study: str) -> None:
    wanted = paper_scale.needs(study, paper_scale.paper_config(study))
    assert {name.lower() for name in wanted} <= paper_extra(), (study, wanted)


# -- the cost model, an estimate --------------------------------------------------------------------------


def test_one_workload_by_hand() -> None:
    # a GPT-2 of 2 layers x 8 over a 100-token BPE, context 16: N = 100·8 + 16·8 + 2·(12·64 + 13·8) + 2·8 = 2,688;
    # T = 10 steps x 4 x 3 accumulated x 16 = 1,920; T_eval = (3 + 5 blocks) x 16 x (dense + 2 levels) = 384;
    # runs: 2 lrs x 2 (α or weight decay) for each of 3 methods on the tuning seed, then 3 methods x 5 seeds
    exp = get("sparse-lm")
    cfg = resolve_config(
        exp.config_cls,
        preset="paper",
        presets=exp.presets,
        overrides=[
            "tokenizer=bpe",
            "bpe_vocab=100",
            "model.n_layer=2",
            "model.n_embd=8",
            "model.n_head=2",
            "model.n_positions=16",
            "train.max_steps=10",
            "train.batch_size=4",
            "train.grad_accum_steps=3",
            "sparsities=[0.5,0.9]",
            "eval_blocks=3",
            "test_blocks=5",
        ],
    )
    work = paper_scale.workload("sparse-lm", cfg)
    assert [g.n_params for g in work.groups] == [2_688, 2_688]
    assert [(g.runs, g.train_tokens, g.eval_tokens) for g in work.groups] == [
        (12, 1_920, 384),
        (15, 1_920, 384),
    ]
    flops = 27 * (6 * 2_688 * 1_920 + 2 * 2_688 * 384)
    assert work.flops() == flops == 891_813_888
    assert work.gpu_hours() == pytest.approx(flops / (0.4 * 989e12) / 3600, rel=1e-12)
    # the study's own tuning plan asks for the same 12 candidates (its equal-budget record)
    from descentlab.experiments.sparse_lm.run import tuning_plan

    assert sum(tuning_plan(cfg).budgets.values()) == work.groups[0].runs


def test_the_gpt2_vocabulary_is_the_tokenizers() -> None:
    # the cost model's GPT-2 N takes the vocabulary from a constant; the real tokenizer must agree
    if importlib.util.find_spec("whisper") is None:
        pytest.skip("the GPT-2 BPE ranks ship with openai-whisper, which is not installed")
    from descentlab.data.bpe import gpt2_tokenizer

    assert paper_cost.GPT2_VOCAB == gpt2_tokenizer().vocab_size == 50_257


def test_the_run_counts_follow_the_studies_tuning_plans() -> None:
    # the tuning runs the cost model counts are the candidates of the studies' own search rounds
    from descentlab.experiments.sparse_vit.run import start_settings as vit_start
    from descentlab.experiments.sparse_vit.run import tuning_plan as vit_plan
    from descentlab.experiments.video_denoising.run import tuning_plan as video_plan

    cfg = paper_scale.paper_config("sparse-vit")
    start, plan = vit_start(cfg), vit_plan(cfg)
    want = sum(len(r.candidates(arm, start)) for r in plan.rounds for arm in r.arms)
    assert paper_scale.workload("sparse-vit", cfg).groups[0].runs == want == 6

    cfg = paper_scale.paper_config("video-denoising")
    plan = video_plan(cfg)
    want = sum(len(r.candidates(arm, {})) for r in plan.rounds for arm in r.arms)
    got = [g.runs for g in paper_scale.workload("video-denoising", cfg).groups if "tuning" in g.what]
    assert sum(got) == want


def test_every_estimate_is_labelled_and_states_its_model() -> None:
    intro, *parts = paper_scale.render(RESULTS).split("\n## ")
    assert "Cost model (an estimate" in intro and "6·N·T" in intro and "396 TFLOP/s" in intro
    sections = {part.split("\n", 1)[0]: part for part in parts}
    assert list(sections) == list(paper_scale.STUDIES)
    for study, part in sections.items():
        (row,) = [line for line in part.splitlines() if line.startswith("| GPU-hours (estimate) |")]
        assert "GPU-hours, an estimate** (not measured)" in row
        hours = paper_scale.workload(study).gpu_hours()
        assert f"≈ {paper_scale._hours(hours)} GPU-hours" in row and hours > 0
    # where the model misses what dominates, the row says so
    assert "not in the estimate" in sections["llm-robustness"]
    assert "a floor, not a forecast" in sections["video-denoising"]


# -- the regime map's prediction --------------------------------------------------------------------------


def regime_map_results(folder: Path) -> dict:
    """A regime-map results.json built by the study's own report code from synthetic cells (3 seeds)."""
    np = pytest.importorskip("numpy")
    from descentlab.experiments.regime_map import report
    from descentlab.experiments.regime_map.config import RegimeMapConfig, condition, design
    from descentlab.study.cells import CellStore

    cfg = RegimeMapConfig(seeds=[0, 1, 2])
    found = design(cfg)
    found = replace(
        found, extra={**found.extra, "params": {"d32": 120_000, "d64": 330_000, "d128": 1_060_000}}
    )
    store, rng = CellStore(found), np.random.default_rng(0)
    for size in cfg.horst_sizes:
        for p in [0.0, *cfg.sparsities]:
            store.put("nll", "adamw", condition("horst", size, p), 4 + rng.normal(size=(3, 16)))
            store.put("nll", "horst", condition("horst", size, p), 3.9 + rng.normal(size=(3, 16)))
    for depth in cfg.constrained_depths:
        for arm in ("erm", "constrained"):
            for metric in ("noisy", "clean"):
                store.put(
                    metric, arm, condition("constrained", depth), rng.integers(0, 2, (3, 50)).astype(float)
                )
    results = {
        "experiment": "regime-map",
        "config": asdict(cfg),
        "tables": [t.to_dict() for t in report.tables(store)],
    }
    (folder / "regime-map").mkdir(parents=True)
    (folder / "regime-map" / "results.json").write_text(json.dumps(results, ensure_ascii=False))
    return results


def test_without_a_committed_regime_map_each_section_says_so(tmp_path) -> None:
    for study in ("sparse-lm", "text-robustness"):
        part = paper_scale.section(study, tmp_path)
        assert f"| regime-map prediction | {paper_scale.NOT_COMMITTED} |" in part


def test_the_prediction_rows_are_read_from_the_regime_map(tmp_path) -> None:
    results = regime_map_results(tmp_path)
    trend = next(t for t in results["tables"] if t["title"].startswith(paper_scale.TREND_TABLE))
    (row,) = [r for r in trend["rows"] if r[0] == "90 %"]  # the sparse-lm paper preset's primary sparsity
    part = paper_scale.section("sparse-lm", tmp_path)
    (line,) = [x for x in part.splitlines() if x.startswith("| regime-map prediction |")]
    assert all(str(cell) in line for cell in row[1:]) and trend["note"] in line
    assert "Prediction (extrapolated), not a verdict; this run tests it." in line
    assert "124,439,808 parameters (this preset's N)" in line
    other = [r for r in trend["rows"] if r[0] != "90 %"]
    assert not any(r[2] in line for r in other)

    depth = next(t for t in results["tables"] if t["title"].startswith(paper_scale.DEPTH_TABLE))
    part = paper_scale.section("text-robustness", tmp_path)
    (line,) = [x for x in part.splitlines() if x.startswith("| regime-map prediction |")]
    assert all(f"{r[0]} layers: " in line and r[1] in line and r[2] in line for r in depth["rows"])
    assert "not a verdict" in line and "12 layers" in line
    # the studies the regime map does not sweep say that, whatever it holds
    assert "sweeps no effect" in paper_scale.section("llm-robustness", tmp_path)
    # --results reaches the page
    page = tmp_path / "page.md"
    assert paper_scale.main([str(page), "--results", str(tmp_path)]) == 0
    assert "this run tests it" in page.read_text()
