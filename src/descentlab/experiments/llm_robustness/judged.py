"""llm-robustness's generate-then-judge comparison, AlpacaEval-style: each fine-tuned model answers the held-out
prompts (greedy, under each judged condition's embedding noise), and a judge LM compares every method's answer
with the baseline's, each pair in both orders (:class:`~descentlab.robustness.judge.GenerativeJudge`).

The win rate is reported raw and length-controlled (:mod:`descentlab.robustness.length_control`: a logistic
length correction, AlpacaEval 2.0's without its instruction-difficulty term), each with the seed-level
interval of :func:`~descentlab.report.stats.paired_interval` against 1/2. The likelihood judge stays the
study's judge of record: the claims (:mod:`.claims`, primary endpoint included) read its outcomes; the
judged win rates are a table, a note and ``arrays/judged.npz`` (``judged/<method>/<condition>`` and
``judged_lc/<method>/<condition>``, ``[seeds, draws, examples]``).

Off unless ``generative.model`` names a judge (a local folder or a Hugging Face id). A judge must be a
stronger model than the judged ones for its verdicts to mean anything: AlpacaEval uses GPT-4-class judges.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from descentlab.data import load_causal_lm
from descentlab.data.instructions import collate_causal, example_prompt
from descentlab.errors import ConfigError
from descentlab.experiments.llm_robustness.jobs import _WORKER, _load_trained, run_tag
from descentlab.report.stats import paired_interval
from descentlab.robustness.judge import PAIRWISE_TEMPLATE, GenerativeJudge, Noise, generate_responses
from descentlab.robustness.length_control import length_controlled
from descentlab.train.jobs import JobRunner
from descentlab.train.rundir import RunDir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CONDITION = re.compile(r"^(clean|[a-z]+-x[0-9.]+|[a-z]+@[0-9.eE+-]+)$")
JUDGED_ARRAYS = "arrays/judged.npz"


@dataclass
class GenerativeJudgeConfig:
    """The generate-then-judge comparison (module docs); off while ``model`` is None."""

    model: str | None = None  # the judge LM: a local folder or a Hugging Face id
    # condition names judged, as the claims name them: clean, <kind>-x<ratio>, <kind>@<level>
    conditions: list[str] = field(default_factory=lambda: ["clean", "gaussian-x3"])
    examples: int | None = None  # the first this many held-out prompts (None: all)
    max_new_tokens: int = 512
    batch_size: int = 8  # prompts per generate call
    judge_batch_size: int = 4  # judge sequences per forward pass
    soft: bool = False  # the judge's verdict σ(s_1 − s_2) instead of 1[s_1 > s_2]
    dtype: str = "bfloat16"  # the judge's weights
    template: str = PAIRWISE_TEMPLATE

    def __post_init__(self) -> None:
        bad = [c for c in self.conditions if not _CONDITION.match(str(c))]
        if bad or not self.conditions:
            raise ConfigError(
                f"generative.conditions must be condition names (clean, <kind>-x<ratio>, <kind>@<level>), "
                f"got {bad or self.conditions}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"generative.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.examples is not None and self.examples < 1:
            raise ConfigError(f"generative.examples must be >= 1 or null, got {self.examples}")
        if min(self.max_new_tokens, self.batch_size, self.judge_batch_size) < 1:
            raise ConfigError("generative.max_new_tokens, batch_size and judge_batch_size must be >= 1")
        for name in ("{prompt}", "{first}", "{second}"):
            if name not in self.template:
                raise ConfigError(f"generative.template lacks the {name} field")


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def generate_job(
    cfg: Any, tag: str, held: list[dict], conditions: Mapping[str, list], run: RunDir
) -> dict[str, Any]:
    """The fine-tune ``tag`` (one method on one seed) answers the held-out prompts under each condition's
    noise (greedy).

    Returns per condition the decoded answers and their lengths in tokens (the length control's input).
    """
    g = cfg.generative
    model, tok = _load_trained(cfg, tag, run)
    model.to(_device())
    prompts = [example_prompt(e) for e in held]
    started = time.perf_counter()
    out: dict[str, Any] = {}
    for name, (kind, level) in conditions.items():
        rows = generate_responses(
            model,
            prompts,
            pad_token_id=int(tok.pad_token_id),
            eos_token_id=tok.eos_token_id,
            max_new_tokens=g.max_new_tokens,
            batch_size=g.batch_size,
            noise=Noise(kind, float(level), seed=cfg.grid.noise_seed),
        )
        out[name] = {
            "texts": [tok.decode(r, skip_special_tokens=True).strip() for r in rows],
            "tokens": [len(r) for r in rows],
        }
    return {"conditions": out, "seconds": time.perf_counter() - started}


def judge_job(
    cfg: Any,
    prompts: list[str],
    generations: Mapping[str, Mapping[str, Any]],
    pairs: Mapping[str, list[list[str]]],
) -> dict[str, Any]:
    """The judge compares every method's answers with the baseline's of the same seed at every condition,
    both orders. ``generations[tag]``: one fine-tune's answers; ``pairs[method]``: ``[tag, baseline tag]``
    per evaluation seed. Per method and condition: per-seed lists of the per-example preferences and
    length-controlled cells, the mean raw and length-controlled win rates, each seed's length coefficient."""
    g = cfg.generative
    _WORKER.clear()  # the judged models leave the device before the judge arrives
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    # on GPUs the judge is spread over every visible device (a 70B judge fits no single one)
    placement = {"device_map": "auto"} if torch.cuda.is_available() else {}
    judge_model, judge_tok = load_causal_lm(g.model, dtype=DTYPES[g.dtype], **placement)
    judge = GenerativeJudge(
        judge_model,
        judge_tok,
        collate_fn=collate_causal,
        template=g.template,
        soft=g.soft,
        batch_size=g.judge_batch_size,
    )
    started = time.perf_counter()
    out: dict[str, Any] = {}
    for method, seed_pairs in pairs.items():
        per_seed: dict[str, list[tuple[Any, Any, Any]]] = {}
        for tag, base_tag in seed_pairs:
            base = generations[base_tag]["conditions"]
            for name, answers in generations[tag]["conditions"].items():
                p = judge.compare_texts(prompts, answers["texts"], base[name]["texts"]).double().cpu().numpy()
                lc = length_controlled(p, np.asarray(answers["tokens"]), np.asarray(base[name]["tokens"]))
                per_seed.setdefault(name, []).append((p, lc, (answers["tokens"], base[name]["tokens"])))
        for name, rows in per_seed.items():
            out.setdefault(method, {})[name] = {
                "preferences": [p.tolist() for p, _, _ in rows],
                "adjusted": [lc.adjusted.tolist() for _, lc, _ in rows],
                "win_rate": float(np.mean([lc.raw_rate for _, lc, _ in rows])),
                "lc_win_rate": float(np.mean([lc.rate for _, lc, _ in rows])),
                "length_coefficient": [lc.phi for _, lc, _ in rows],
                "length_controlled": all(lc.fitted for _, lc, _ in rows),
                "mean_tokens": float(np.mean([t for _, _, (mine, _) in rows for t in mine])),
                "baseline_mean_tokens": float(np.mean([t for _, _, (_, theirs) in rows for t in theirs])),
            }
    del judge, judge_model
    gc.collect()
    return {"verdicts": out, "seconds": time.perf_counter() - started}


def job(kind: str, *args: Any) -> dict:
    """The generate-then-judge jobs (top level: they run in spawned workers too)."""
    return {"generate": generate_job, "judge": judge_job}[kind](*args)


def run_generative_judge(
    cfg: Any,
    held: list[dict],
    conditions: Mapping[str, tuple[str, float]],
    run: RunDir,
    tokenizer: Any,
) -> dict[str, Any]:
    """Generate with every method on every evaluation seed under each judged condition, then judge each
    against the baseline of the same seed.

    ``conditions``: every condition of the run (name -> (kind, level)); those named in
    ``cfg.generative.conditions`` are judged. Each step is a job cached in ``jobs/`` (``generate-<method>-seed<s>``,
    ``judge``), so a resumed run redoes none of them.
    """
    g = cfg.generative
    missing = [c for c in g.conditions if c not in conditions]
    if missing:
        raise ConfigError(
            f"generative.conditions {missing} are not conditions of this run; it has {sorted(conditions)}"
        )
    judged = {c: [conditions[c][0], float(conditions[c][1])] for c in g.conditions}
    examples = held[: g.examples] if g.examples is not None else held
    prompts = [tokenizer.decode(example_prompt(e), skip_special_tokens=True) for e in examples]
    order = [cfg.baseline, *[m for m in cfg.methods if m != cfg.baseline]]
    tags = [run_tag(m, s) for m in order for s in cfg.seeds]
    pairs = {
        m: [[run_tag(m, s), run_tag(cfg.baseline, s)] for s in cfg.seeds] for m in order if m != cfg.baseline
    }
    with JobRunner(job, workers=1, cache_dir=run.path / "jobs") as jobs:
        generations = {
            t: jobs.submit(f"generate-{t}", "generate", cfg, t, examples, judged, run).result() for t in tags
        }
        verdicts = jobs.submit("judge", "judge", cfg, prompts, generations, pairs).result()
    return {"conditions": judged, "examples": len(examples), "generations": generations, **verdicts}


def judged_arrays(verdicts: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """``judged/<m>/<c>`` (raw preferences) and ``judged_lc/<m>/<c>`` (length-controlled cells), each
    ``[seeds, 1, examples]`` (one greedy answer per prompt: one draw)."""
    out = {}
    for method, by_condition in verdicts.items():
        for name, v in by_condition.items():
            out[f"judged/{method}/{name}"] = np.asarray(v["preferences"], dtype=np.float64)[:, None]
            out[f"judged_lc/{method}/{name}"] = np.asarray(v["adjusted"], dtype=np.float64)[:, None]
    return out


def judged_table(judged: Mapping[str, Any], baseline: str, judge_name: str) -> dict[str, Any]:
    """Raw and length-controlled win rates against the baseline, each with its seed-level 95 % interval."""

    def rate(cells: list[list[float]]) -> str:
        a = np.asarray(cells, dtype=np.float64)[:, None]  # [seeds, 1, examples]
        iv = paired_interval(a, np.full_like(a, 0.5))
        return f"{100 * (0.5 + iv.mean):.1f} % [{100 * (0.5 + iv.low):.1f}, {100 * (0.5 + iv.high):.1f}]"

    rows = []
    for method, by_condition in judged["verdicts"].items():
        for name, v in by_condition.items():
            rows.append(
                [
                    method,
                    name,
                    rate(v["preferences"]),
                    rate(v["adjusted"]) if v["length_controlled"] else "(no length spread: = raw)",
                    ", ".join(f"{phi:+.3f}" for phi in v["length_coefficient"]),
                    f"{v['mean_tokens']:.0f} / {v['baseline_mean_tokens']:.0f}",
                ]
            )
    return {
        "title": f"Generate then judge against {baseline} (judge {judge_name}, both orders): win rate and "
        "length-controlled win rate [seed-level 95 % interval], length coefficient per seed, mean answer tokens "
        "(method / baseline)",
        "columns": ["method", "condition", "win rate", "LC win rate", "phi", "tokens"],
        "rows": rows,
    }


__all__ = [
    "JUDGED_ARRAYS",
    "GenerativeJudgeConfig",
    "judged_arrays",
    "judged_table",
    "run_generative_judge",
]
