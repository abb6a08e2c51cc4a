"""The house plan's walls (DESIGN.md "The experiment layer"), checked on the source, not on trust.

Every ``import`` statement of every module under src/descentlab is read with ``ast`` (imports inside
functions included), so a lazy import cannot slip through a wall either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "descentlab"
METHOD_PACKAGES = ("constrained", "optim", "sparsity", "readout", "robustness")
MAX_LINES = 400


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


def test_robustness_does_not_load_data() -> None:
    assert _breaches("robustness", ("data",)) == []


def test_no_experiment_imports_another() -> None:
    # private modules (``_video_config``) are one experiment's helpers, not experiments
    experiments = {p.stem for p in (SRC / "experiments").glob("*.py") if not p.stem.startswith("_")}
    found = [
        f"{file} imports {name}"
        for file, names in _package_imports("experiments").items()
        for name in names
        if any(
            name.startswith(f"descentlab.experiments.{other}") and not file.endswith(f"/{other}.py")
            for other in experiments - {"base"}
        )
    ]
    assert found == []


def test_no_source_file_is_over_the_size_guideline() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_scanner_sees_lazy_and_string_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from descentlab.train.loop import fit\n"
        "import importlib\nimportlib.import_module('descentlab.experiments.smoke')\n"
    )
    assert {"descentlab.train.loop", "descentlab.experiments.smoke"} <= _imported_modules(module)
