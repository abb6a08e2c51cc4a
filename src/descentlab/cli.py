"""Command line: ``descentlab list | config | run | report | demo | reproduce``.

Exit codes: 0 success; 2 usage, config or input error (one clear message on stderr, no traceback);
1 failure during the run; 130 interrupted (SIGTERM / Ctrl-C). ``run`` prints the run directory as the last
line of standard output, also when interrupted (then stderr says how to resume it). A run that fails on an
input error before anything was trained leaves no run directory.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from descentlab.errors import ConfigError, DescentlabError
from descentlab.train.loop import TrainingInterrupted

if TYPE_CHECKING:
    from descentlab.report.wall_times import WallTime


def _plain(text: str) -> str:
    """Docstring text for the terminal: reST literals (``x``) and roles (:func:`x`) as plain words."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("`", "")


def _version() -> str:
    try:
        return importlib.metadata.version("descentlab")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from descentlab import __version__

        return __version__


def describe(name: str, width: int = 100) -> str:
    """One line about an experiment: the first paragraph of its study's docstring, without the leading
    ``name:``, cut at the first sentence and at ``width`` characters (on a word)."""
    from descentlab.experiments import get

    doc = (get(name).module.__doc__ or "").strip()
    text = " ".join(doc.split("\n\n", 1)[0].split())
    if text.startswith(f"{name}:"):
        text = text[len(name) + 1 :].strip()
    text = _plain(re.split(r"(?<=[.?!])\s", text, maxsplit=1)[0])
    if len(text) > width:
        text = text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors also exit 2, with our format
        self.print_usage(sys.stderr)
        print(f"descentlab: error: {message}", file=sys.stderr)
        raise SystemExit(2)


_CONFIG_FILE_HELP = (
    "YAML config, e.g. what 'descentlab config NAME' printed; applied after --preset, before key=value"
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="descentlab", description=_plain(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=f"descentlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser(
        "list",
        help="print the studies, one a line: what each does, its presets with their wall time measured on "
        "the reference 2-core machine (from the committed result pages; 'unmeasured' where none), and "
        "what a run writes",
    )
    listing.add_argument(
        "--long",
        action="store_true",
        help="also each preset's settings and the files a run writes",
    )
    config = sub.add_parser(
        "config", help="print an experiment's resolved config (YAML), as run would use it; nothing is run"
    )
    config.add_argument("name")
    config.add_argument(
        "--preset", default=None, help="quick, full, or another preset the experiment defines"
    )
    config.add_argument("--config", dest="config_file", default=None, metavar="FILE", help=_CONFIG_FILE_HELP)
    config.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for run")
    run = sub.add_parser("run", help="run an experiment into a fresh run directory")
    run.add_argument("name")
    run.add_argument(
        "--preset", default=None, help="quick, full, or another preset the experiment defines (e.g. budget)"
    )
    run.add_argument("--out", default="runs", help="folder that receives the run directory (default: runs)")
    run.add_argument("--config", dest="config_file", default=None, metavar="FILE", help=_CONFIG_FILE_HELP)
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
    """No hub traffic unless asked: DESCENTLAB_ONLINE=1 (or an explicit HF_HUB_OFFLINE=0) allows downloads.

    The library's loaders follow the same policy (:func:`descentlab.data.hub.hub_online`); here the hub
    clients are also switched off, for code that reaches them directly."""
    from descentlab.data.hub import hub_online

    if not hub_online():
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ.setdefault(var, "1")


def _children(folder: str) -> set[Path]:
    try:
        return set(Path(folder).iterdir())
    except OSError:  # missing or unreadable: RunDir.create reports it
        return set()


def _check_resume_experiment(name: str, resume: str) -> None:
    """resume= a run of another experiment: say whose run it is, in one line (config.json names it)."""
    try:
        made_by = json.loads((Path(resume) / "config.json").read_text()).get("experiment")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(made_by, str) and made_by != name:
        raise ConfigError(
            f"{resume} is a run of {made_by!r}, not {name!r}; resume it with: descentlab run {made_by} "
            f"resume={resume}"
        )


# what every `descentlab run` leaves in its run directory (experiments.prepare / run_experiment, train.loop)
RUN_FILES = (
    "provenance.json, config.yaml, config.json, status.json, metrics.jsonl, metrics.csv, tensorboard/, "
    "checkpoints/, results.json, report.md, tables/*.csv, figures/*.png"
)


def _long_listing(name: str, width: int = 100) -> list[str]:
    """``list --long``: each preset with the keys it sets (cut at ``width``), then what a run writes."""
    from descentlab.experiments import get

    lines = []
    for preset, keys in get(name).presets.items():
        text = f"--preset {preset}: " + (", ".join(f"{k}={v}" for k, v in keys.items()) or "the defaults")
        lines.append(text if len(text) <= width else text[: width - 1].rsplit(", ", 1)[0] + ", …")
    lines.append(f"writes: RUN_DIR/ {RUN_FILES}")
    return lines


def _list_line(name: str, measured: dict[str, WallTime]) -> str:
    """``list``: what the study does, each preset with its wall time measured on the reference machine
    (2 CPU cores; read from the committed result pages, :mod:`descentlab.report.wall_times`), or
    ``unmeasured``, and what a run writes."""
    from descentlab.experiments import REGISTRY, get
    from descentlab.report.wall_times import format_duration

    presets = ", ".join(
        f"{p} {format_duration(measured[p].seconds) if p in measured else 'unmeasured'}"
        for p in get(name).presets
    )
    try:  # a study with claims saves the arrays they are judged on (a one-file study has no parts)
        arrays = importlib.util.find_spec(f"{REGISTRY[name]}.claims") is not None
    except ModuleNotFoundError:
        arrays = False
    files = f"report.md, results.json, metrics.csv, figures/{', arrays/' if arrays else ''}"
    return (
        f"{describe(name, width=72)} [presets, wall time on 2 cores: {presets or 'none'}] "
        f"writes: runs/{name}-<date>-<time>/{{{files}}}"
    )


def _check_out(out: str) -> None:
    """``--out`` must name a folder: an empty or blank value would put the run in the current directory."""
    if not out.strip():
        raise ConfigError("--out is empty; pass the folder that receives the run directory (default: runs)")


def main(argv: Sequence[str] | None = None) -> int:
    _offline_by_default()
    parser = build_parser()
    # key=value overrides may come before or after --preset/--out, which argparse's positionals do not allow
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command not in ("run", "config") or any(item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        if args.command == "list":
            from descentlab.experiments import available
            from descentlab.report.wall_times import measured_wall_times

            names = available()
            width = max(map(len, names), default=0)
            measured = measured_wall_times()
            for name in names:
                print(f"{name:<{width}}  {_list_line(name, measured.get(name, {}))}")
                if args.long:
                    for line in _long_listing(name):
                        print(f"{'':<{width}}  {line}")
            sys.stdout.flush()  # inside the try: a reader that left (`| head`) is a BrokenPipeError here
            return 0
        if args.command == "config":
            from descentlab.config import config_to_yaml, resolve_config
            from descentlab.experiments import get

            exp = get(args.name)
            cfg = resolve_config(
                exp.config_cls,
                preset=args.preset,
                presets=exp.presets,
                overrides=args.overrides,
                config_file=args.config_file,
            )
            print(config_to_yaml(cfg), end="")
            return 0
        if args.command == "report":
            from descentlab.experiments import report_run

            print(report_run(args.run_dir))
            return 0
        from descentlab.experiments import DEMO, available, run_experiment, run_many

        _check_out(args.out)
        if args.command == "run":
            resume = None
            overrides = []
            for item in args.overrides:
                if item.startswith("resume="):
                    resume = item.split("=", 1)[1]
                else:
                    overrides.append(item)
            if resume is not None:
                _check_resume_experiment(args.name, resume)
            before = _children(args.out) if resume is None else None
            try:
                path = run_experiment(
                    args.name,
                    preset=args.preset,
                    overrides=overrides,
                    out=args.out,
                    resume=resume,
                    config_file=args.config_file,
                    argv=["descentlab", *(sys.argv[1:] if argv is None else argv)],
                )
            except DescentlabError:
                if before is not None:  # a fresh run that failed before training leaves nothing behind
                    from descentlab.train.rundir import discard_untrained

                    for made in _children(args.out) - before:
                        discard_untrained(made)
                raise
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
        if exc.run_dir is not None:  # stdout's last line is the run directory, as after a finished run
            print(
                f"descentlab: resume it with: descentlab run {getattr(args, 'name', 'NAME')} resume={exc.run_dir}",
                file=sys.stderr,
            )
            print(exc.run_dir, flush=True)
        return 130
    except KeyboardInterrupt:
        print("descentlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `descentlab list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
