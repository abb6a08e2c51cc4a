"""Command line: ``descentlab list | run | report | demo | reproduce``.

Exit codes: 0 success; 2 usage, config or input error (one clear message on stderr, no traceback);
1 failure during the run. ``run`` prints the run directory as the last line of standard output.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from descentlab.errors import DescentlabError
from descentlab.train.loop import TrainingInterrupted


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors also exit 2, with our format
        self.print_usage(sys.stderr)
        print(f"descentlab: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="descentlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print the experiment names, one a line")
    run = sub.add_parser("run", help="run an experiment into a fresh run directory")
    run.add_argument("name")
    run.add_argument(
        "--preset", default=None, help="quick, full, or another preset the experiment defines (e.g. budget)"
    )
    run.add_argument("--out", default="runs", help="folder that receives the run directory (default: runs)")
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. train.epochs=2; resume=RUN_DIR continues a run",
    )
    report = sub.add_parser("report", help="rebuild report.md of a run directory")
    report.add_argument("run_dir")
    for name, text in (
        ("demo", "the headline quick runs, one report"),
        ("reproduce", "every quick preset, one report"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--out", default="runs")
    return parser


def _offline_by_default() -> None:
    """No hub traffic unless asked: DESCENTLAB_ONLINE=1 (or an explicit HF_HUB_OFFLINE=0) allows downloads."""
    if os.environ.get("DESCENTLAB_ONLINE") != "1":
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ.setdefault(var, "1")


def main(argv: Sequence[str] | None = None) -> int:
    _offline_by_default()
    parser = build_parser()
    # key=value overrides may come before or after --preset/--out, which argparse's positionals do not allow
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "run" or any(item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        if args.command == "list":
            from descentlab.experiments import available

            print("\n".join(available()))
            return 0
        if args.command == "report":
            from descentlab.experiments import report_run

            print(report_run(args.run_dir))
            return 0
        from descentlab.experiments import DEMO, available, run_experiment, run_many

        if args.command == "run":
            resume = None
            overrides = []
            for item in args.overrides:
                if item.startswith("resume="):
                    resume = item.split("=", 1)[1]
                else:
                    overrides.append(item)
            path = run_experiment(
                args.name, preset=args.preset, overrides=overrides, out=args.out, resume=resume
            )
            print(path)
            return 0
        names = (
            [n for n in DEMO if n in available()]
            if args.command == "demo"
            else [n for n in available() if n != "smoke"]
        )
        names = names or ["smoke"]
        title = "descentlab demo" if args.command == "demo" else "descentlab reproduce"
        report = run_many(names, out=args.out, preset="quick", title=title)
        print(report)
        return 0
    except DescentlabError as exc:
        print(f"descentlab: error: {exc}", file=sys.stderr)
        return 2
    except TrainingInterrupted as exc:
        print(f"descentlab: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("descentlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
