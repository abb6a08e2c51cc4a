"""The README's quick start runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from descentlab.data import available_assets

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.skipif(
    not (available_assets().get("minilm") and available_assets().get("rotten_tomatoes")),
    reason="MiniLM or Rotten Tomatoes not installed (run `make setup`)",
)
def test_quick_start_runs() -> None:
    section = README.read_text().split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["constraint"].multipliers.shape == (6,)
    assert namespace["noisy"].shape == (16, 2)
    assert namespace["acdc"].sparsity == 0.9
