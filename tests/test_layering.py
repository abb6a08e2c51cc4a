"""The house plan's walls (DESIGN.md "The experiment layer"), checked on the source, not on trust.

Every ``import`` statement of every module under src/descentlab is read with ``ast`` (imports inside
functions included), so a lazy import cannot slip through a wall either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "descentlab"
METHOD_PACKAGES = ("constrained", "optim", "sparsity", "readout", "perturbations", "evaluation")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
            "import_module",
            "__import__",
        ):
            names.update(
                a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
    return {n for n in names if n.startswith("descentlab")}


def _package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(SRC)): _imported_modules(p) for p in sorted((SRC / package).rglob("*.py"))}


def _breaches(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{file} imports {name}"
        for file, names in _package_imports(package).items()
        for name in sorted(names)
        if any(name == f"descentlab.{f}" or name.startswith(f"descentlab.{f}.") for f in forbidden)
    ]


@pytest.mark.parametrize("package", [*METHOD_PACKAGES, "report", "models"])
def test_library_layers_never_import_the_application_layers(package: str) -> None:
    assert _breaches(package, ("train", "experiments", "cli")) == []


def test_report_never_imports_train_or_experiments() -> None:
    assert _breaches("report", ("train", "experiments")) == []


def test_models_import_no_method_module() -> None:
    assert _breaches("models", (*METHOD_PACKAGES, "data")) == []


def test_readout_finds_models_by_their_outputs() -> None:
    assert _breaches("readout", ("models",)) == []


def test_perturbations_and_evaluation_do_not_load_data() -> None:
    assert _breaches("perturbations", ("data",)) == []
    assert _breaches("evaluation", ("data",)) == []


def _studies() -> set[str]:
    """Study module names: the registry's folders and one-file studies (``smoke``); the other modules of
    experiments/ (the runner, the page generators) are shared code every study may be read by."""
    from descentlab.experiments import REGISTRY

    root = SRC / "experiments"
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    registered = {module.rsplit(".", 1)[1] for module in REGISTRY.values()}
    assert folders <= registered, f"study folders outside the registry: {sorted(folders - registered)}"
    return registered


def _study_of(file: str) -> str | None:
    parts = Path(file).parts  # experiments/<study>/x.py or experiments/<study>.py
    if len(parts) >= 3:
        return parts[1]
    return Path(parts[1]).stem if parts[1] != "__init__.py" else None


def test_no_study_imports_another() -> None:
    studies = _studies()
    found = [
        f"{file} imports {name}"
        for file, names in _package_imports("experiments").items()
        for name in names
        for other in studies
        if (name == f"descentlab.experiments.{other}" or name.startswith(f"descentlab.experiments.{other}."))
        and _study_of(file) not in (other, None)
    ]
    assert found == []


def test_claims_never_import_train_or_their_run() -> None:
    found = []
    for file, names in _package_imports("experiments").items():
        if Path(file).stem != "claims":
            continue
        study = _study_of(file)
        for name in sorted(names):
            if name == "descentlab.train" or name.startswith("descentlab.train."):
                found.append(f"{file} imports {name}")
            if name.startswith(f"descentlab.experiments.{study}.run") or name.startswith(
                f"descentlab.experiments.{study}.jobs"
            ):
                found.append(f"{file} imports {name}")
    assert found == []


@pytest.mark.parametrize("package", METHOD_PACKAGES)
def test_method_packages_never_import_report(package: str) -> None:
    assert _breaches(package, ("report",)) == []


def test_train_never_imports_experiments() -> None:
    assert _breaches("train", ("experiments", "report")) == []


def test_report_holds_only_the_generic_library() -> None:
    # study code lives in its study's folder; report/ keeps stats, results, claims, tables, figures, build
    generic = {
        *("__init__", "build", "claims", "coverage", "figures", "results", "stats", "tables", "readme"),
        "fidelity",  # Deviation / NotTested and their rendering; the studies' declarations live in experiments/
        "preregistration",  # "declared before the run" read from git history and the run's provenance.json
        "curves",  # a run's training curves from its metrics.csv
        "wall_times",  # each committed run's wall time, from its provenance or its result page (descentlab list)
        "pages",  # the claims tables of the result pages, generated from each run's results.json
        "cost",  # the stated FLOP cost model of docs/paper-scale.md (parameter counts, GPU-hour estimates)
    }
    assert {p.stem for p in (SRC / "report").glob("*.py")} - generic == set()


def test_the_scanner_sees_lazy_and_string_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from descentlab.train.loop import fit\n"
        "import importlib\nimportlib.import_module('descentlab.experiments.smoke')\n"
    )
    assert {"descentlab.train.loop", "descentlab.experiments.smoke"} <= _imported_modules(module)


# A study's five files are layers: each imports only the layers below it in its own study, so no import
# circle can form and no core module (config, jobs) depends on a leaf (claims, report, run).
STUDY_LAYERS = ("config", "jobs", "legacy", "claims", "report", "run")


def test_a_study_s_files_import_only_the_layers_below_them() -> None:
    found = []
    for file, names in _package_imports("experiments").items():
        study, stem = _study_of(file), Path(file).stem
        if study is None or stem not in STUDY_LAYERS:
            continue
        below = STUDY_LAYERS[: STUDY_LAYERS.index(stem)]
        for name in sorted(names):
            parts = name.split(".")
            layer = parts[3] if parts[:3] == ["descentlab", "experiments", study] and len(parts) > 3 else None
            if layer in STUDY_LAYERS and layer not in below:
                found.append(f"{file} imports {name}")
    assert found == []
