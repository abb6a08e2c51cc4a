"""Simulated 95 % coverage of the seed-level interval and of the pigeonhole bootstrap it replaced.

Writes ``docs/results/coverage.json``, which the generated ``docs/results/README.md`` renders as a table.
The designs are crossed seeds x examples with true difference 0 (``descentlab.report.coverage``).

    python scripts/interval_coverage.py [--reps 2000] [--reps-bootstrap 400]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from descentlab.report.coverage import REGIMES, coverage, pigeonhole, seed_level

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "coverage.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--reps-bootstrap", type=int, default=400)
    args = parser.parse_args()
    start = time.perf_counter()
    grid = [(r, s, e) for s in (3, 5, 10) for e in (200, 1000) for r in REGIMES]
    rows = []
    for regime, seeds, examples in tqdm(grid, desc="coverage"):
        seed = seeds * examples
        rows.append(
            {
                "regime": regime.name,
                "seeds": seeds,
                "examples": examples,
                "seed_share": regime.seed_share(seeds, examples),
                "seed_level": coverage(seed_level, regime, seeds, examples, reps=args.reps, seed=seed),
                "pigeonhole": coverage(
                    pigeonhole, regime, seeds, examples, reps=args.reps_bootstrap, seed=seed
                ),
            }
        )
    body = {
        "command": "python scripts/interval_coverage.py",
        "reps": {"seed_level": args.reps, "pigeonhole": args.reps_bootstrap},
        "regimes": {r.name: [r.seed_sd, r.example_sd, r.residual_sd] for r in REGIMES},
        "wall_seconds": round(time.perf_counter() - start),
        "rows": rows,
    }
    OUT.write_text(json.dumps(body, indent=1) + "\n")
    print(OUT)


if __name__ == "__main__":
    main()
