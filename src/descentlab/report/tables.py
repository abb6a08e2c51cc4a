"""Markdown and CSV tables from the results.json blocks (the same shape for every experiment)."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Mapping, Sequence
from typing import Any


def fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return (
            f"{value:.{digits}g}"
            if abs(value) >= 1e4 or (value != 0 and abs(value) < 1e-3)
            else f"{value:.{digits}f}"
        )
    return str(value)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "| " + " | ".join(str(c) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def csv_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    writer.writerows(rows)
    return out.getvalue()


def metrics_table(methods: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """One row per method, one column per metric (union over methods)."""
    names: list[str] = []
    for block in methods.values():
        names.extend(k for k in block.get("metrics", {}) if k not in names)
    rows = [
        [method, *[block.get("metrics", {}).get(k, "") for k in names]] for method, block in methods.items()
    ]
    return ["method", *names], rows


def curve_names(methods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for block in methods.values():
        names.extend(k for k in block.get("curves", {}) if k not in names)
    return names


def curve_table(
    methods: Mapping[str, Mapping[str, Any]], name: str
) -> tuple[list[str], list[list[Any]], str]:
    """Rows = methods, columns = x values, cells = "mean ± std". Returns (columns, rows, metric caption)."""
    xs: list[Any] = []
    caption = ""
    for block in methods.values():
        curve = block.get("curves", {}).get(name)
        if curve:
            xs.extend(x for x in curve["x"] if x not in xs)
            caption = f"{curve.get('metric', '')} vs {curve.get('x_name', 'x')}"
    rows = []
    for method, block in methods.items():
        curve = block.get("curves", {}).get(name)
        if not curve:
            continue
        cells = []
        for x in xs:
            if x in curve["x"]:
                i = curve["x"].index(x)
                std = (curve.get("std") or [None] * len(curve["x"]))[i]
                cells.append(fmt(curve["mean"][i]) + (f" ± {std:.2g}" if std else ""))
            else:
                cells.append("")
        summary = curve.get("summary")
        rows.append([method, *cells, *([fmt(summary)] if summary is not None else [])])
    has_summary = any(len(r) == len(xs) + 2 for r in rows)
    columns = ["method", *[fmt(x, 3) for x in xs], *(["mean over grid"] if has_summary else [])]
    rows = [r + [""] * (len(columns) - len(r)) for r in rows]
    return columns, rows, caption


def layer_loss_table(methods: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Rows = (method, condition), columns = layers 0..L, plus whether the profile is non-increasing."""
    depth = max((len(v) for b in methods.values() for v in b.get("layer_loss", {}).values()), default=0)
    rows = []
    for method, block in methods.items():
        for condition, values in block.get("layer_loss", {}).items():
            monotone = all(b <= a + 1e-12 for a, b in itertools.pairwise(values))
            rows.append(
                [method, condition, *values, *[""] * (depth - len(values)), "yes" if monotone else "no"]
            )
    return ["method", "condition", *[f"L{i}" for i in range(depth)], "monotone"], rows


def multiplier_tables(methods: dict[str, Any]) -> list[dict[str, Any]]:
    """A table of each method's final λ_l (mean over seeds), or nothing when no method has multipliers."""
    rows = [[m, *[f"{x:.3f}" for x in b["multipliers"]]] for m, b in methods.items() if "multipliers" in b]
    if not rows:
        return []
    columns = ["method", *[f"λ{i + 1}" for i in range(len(rows[0]) - 1)]]
    return [{"title": "Final multipliers λ_l (mean over seeds)", "columns": columns, "rows": rows}]
