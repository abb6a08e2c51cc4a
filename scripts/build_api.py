"""Build the HTML API reference from the docstrings with pdoc, offline, and check it for broken references.

    python scripts/build_api.py [--out build/api]      # `make docs` runs this

What is documented: ``descentlab`` (its lazily re-exported ``__all__``) and every public subpackage with its
non-private modules (``constrained``, ``optim``, ``sparsity``, ``readout``, ``perturbations``,
``evaluation``, ``models``, ``integrations``, ``report``, ``data``, ``train``, ``study``, ``errors``). The experiment studies
(``descentlab.experiments``), the command line and the top-level helper modules are internals and are left
out. A module whose optional dependency is not installed (``ModuleNotFoundError`` for a package outside
descentlab) is skipped with a note; any other import error fails the build.

The build needs no network: before anything is imported, the hub libraries are told to stay offline and every
non-local socket connection raises.

After building, :func:`check` fails on a broken reference:

- every internal link (``href`` to another generated page or an anchor) must name a file that exists and,
  with a ``#fragment``, an ``id`` in that file;
- every ``descentlab.…`` dotted name cited as code in a docstring must exist (import the module, look up the
  attribute); pdoc links such a name when it is documented and leaves it as plain code otherwise, so a name
  that was renamed or removed would otherwise go unnoticed;
- every Sphinx role in a documented docstring (:func:`x`, :class:`~pkg.mod.C`, :mod:`.sibling`) names
  something that exists, looked up from the module that cites it, and is in a form pdoc can link (one line,
  no explicit title);
- every name in ``descentlab.__all__`` has an entry on the ``descentlab`` page.

Why pdoc: it is pure Python with three small dependencies (Jinja2, MarkupSafe, Pygments, markdown2), builds
from the imported modules without a config file or a theme, and its output is plain static HTML that a test
can parse; the reference checks are done here on that HTML rather than by a plugin, so mkdocs and
mkdocstrings are not needed.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import pkgutil
import re
import socket
import sys
import time
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_SUBPACKAGES = (
    "constrained",
    "optim",
    "sparsity",
    "readout",
    "perturbations",
    "evaluation",
    "models",
    "integrations",
    "report",
    "data",
    "train",
    "study",
    "errors",
)


def block_network() -> None:
    """Offline switches for the hub libraries, and a socket that refuses every non-local connection."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        if self.family != getattr(socket, "AF_UNIX", None):
            raise OSError(f"network access during the API build: {address!r}")
        return connect(self, address)

    socket.socket.connect = guarded  # type: ignore[method-assign]


def public_modules() -> tuple[list[str], list[str]]:
    """Names of the modules to document, and notes on those skipped for a missing optional dependency."""
    import descentlab

    names, skipped = ["descentlab"], []
    for sub in PUBLIC_SUBPACKAGES:
        candidates = [f"descentlab.{sub}"]
        path = Path(descentlab.__file__).parent / sub
        if path.is_dir():
            candidates += [
                f"descentlab.{sub}.{m.name}"
                for m in pkgutil.iter_modules([str(path)])
                if not m.name.startswith("_")
            ]
        for name in candidates:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as err:
                if err.name and (err.name == "descentlab" or err.name.startswith("descentlab.")):
                    raise
                skipped.append(f"{name} (needs {err.name})")
                continue
            names.append(name)
    return names, skipped


def _rst_roles_with_tilde(text: str) -> str:
    # pdoc turns :func:`x` into `x()` but keeps the Sphinx "~" of :func:`~pkg.mod.x`, which then links nothing
    return re.sub(r"((?::py)?:(?:mod|func|data|const|class|meth|attr|exc|obj):`)~", r"\1", text)


def build(out: Path) -> tuple[list[str], list[str]]:
    """Render the reference into ``out``; returns (documented modules, skipped modules)."""
    import pdoc
    import pdoc.docstrings
    import pdoc.render

    rst = pdoc.docstrings.rst
    if not getattr(rst, "_descentlab_tilde", False):

        def rst_tilde(contents: str, source_file: Path | None) -> str:
            return rst(_rst_roles_with_tilde(contents), source_file)

        rst_tilde._descentlab_tilde = True  # type: ignore[attr-defined]
        pdoc.docstrings.rst = rst_tilde
        pdoc.docstrings.convert.cache_clear()

    modules, skipped = public_modules()
    _relink_inherited_members(pdoc.render)
    pdoc.render.configure(
        docformat="google",
        show_source=False,
        search=True,
        footer_text="descentlab API reference (pdoc)",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pdoc's notes on unparsable annotations; import errors raise above
        pdoc.pdoc(*modules, output_directory=out)
    return modules, skipped


def _relink_inherited_members(render: object) -> None:
    """Point links to inherited members at the class that defines them, or drop them.

    pdoc links a docstring's ``state_dict`` inside ``HORST`` to ``#HORST.state_dict``, but renders inherited
    members without an anchor of their own, so the link goes nowhere. This filter sends such a link to the
    base class's entry when that class is documented here and turns it into plain code when it is not
    (torch's ``Optimizer``, transformers' ``Trainer``).
    """
    import jinja2
    from markupsafe import Markup
    from pdoc.render_helpers import linkify, relative_link

    env = render.env  # type: ignore[attr-defined]
    if getattr(env.filters["linkify"], "_descentlab", False):
        return

    @jinja2.pass_context
    def linkify_members(
        context: jinja2.runtime.Context, code: str, namespace: str = "", shorten: bool = True
    ):
        html = linkify(context, code, namespace, shorten)
        mod = context["module"]

        def fix(m: re.Match[str]) -> str:
            qualname, text = m.group(1), m.group(2)
            doc = mod.get(qualname)
            if doc is None or "." not in qualname or doc.taken_from[1] == qualname:
                return m.group(0)
            origin_module, origin_qualname = doc.taken_from
            target = context["all_modules"].get(origin_module)
            if target is not None and target.get(origin_qualname) is not None:
                return (
                    f'<a href="{relative_link(mod.modulename, origin_module)}#{origin_qualname}">{text}</a>'
                )
            return text

        return Markup(re.sub(r'<a href="#([\w.]+)">(.*?)</a>', fix, str(html)))

    linkify_members._descentlab = True  # type: ignore[attr-defined]
    env.filters["linkify"] = linkify_members


class _Page(HTMLParser):
    """Ids, hrefs, and the text of every <code> not inside an <a> (pdoc links documented names)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.unlinked_code: list[str] = []
        self._in_a = 0
        self._code: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if a.get("name") and tag == "a":
            self.ids.add(a["name"] or "")
        if tag == "a":
            self._in_a += 1
            if a.get("href"):
                self.hrefs.append(a["href"] or "")
        elif tag == "code" and not self._in_a:
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._in_a = max(0, self._in_a - 1)
        elif tag == "code" and self._code is not None:
            self.unlinked_code.append("".join(self._code))
            self._code = None

    def handle_data(self, data: str) -> None:
        if self._code is not None and not self._in_a:
            self._code.append(data)


_DOTTED = re.compile(r"~?(descentlab(?:\.[A-Za-z_]\w*)+)(?:\(\))?")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


_ROLE = re.compile(r"(?::py)?:(?:mod|func|data|const|class|meth|attr|exc|obj):`([^`]+)`")


def _docstrings(source: str) -> list[str]:
    tree = ast.parse(source)
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, kinds) and (doc := ast.get_docstring(node))]


def _role_resolves(target: str, modname: str, is_package: bool) -> bool:
    """Sphinx-like lookup of a role's target from the module whose docstring cites it."""
    name = target.removeprefix("~").removesuffix("()")
    if name.startswith("."):  # relative: from the package (in __init__) or the sibling modules
        base = modname if is_package else modname.rpartition(".")[0]
        name = name[1:]
        while name.startswith("."):
            name, base = name[1:], base.rpartition(".")[0]
        return _resolves(f"{base}.{name}")
    if _resolves(name):  # absolute: descentlab.…, torch.…
        return True
    module = importlib.import_module(modname)
    scopes = [module, *(c for c in vars(module).values() if isinstance(c, type))]
    if not is_package and "." in modname:
        scopes.append(importlib.import_module(modname.rpartition(".")[0]))
    for scope in scopes:
        obj: object = scope
        try:
            for attr in name.split("."):
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return True
    return False


def check_roles(modules: list[str]) -> list[str]:
    """Sphinx roles (:func:`x`, :class:`~a.b.C`, ...) in the docstrings of ``modules`` whose target does not exist,
    or that pdoc cannot link (an explicit title ``text <target>``, a target broken across lines)."""
    problems = []
    for modname in modules:
        module = importlib.import_module(modname)
        file = getattr(module, "__file__", None)
        if not file:
            continue
        is_package = Path(file).name == "__init__.py"
        for doc in _docstrings(Path(file).read_text(encoding="utf-8")):
            for m in _ROLE.finditer(doc):
                target = m.group(1)
                if "<" in target:
                    problems.append(f"{modname}: {m.group(0)}: pdoc cannot link an explicit title <target>")
                elif re.search(r"\s", target):
                    problems.append(f"{modname}: {m.group(0)!r}: a target broken across lines links nothing")
                elif not _role_resolves(target, modname, is_package):
                    problems.append(f"{modname}: {m.group(0)} names nothing that exists")
    return problems


def check(out: Path, modules: list[str] | None = None) -> list[str]:
    """Broken references in the reference built into ``out`` (empty when there are none); with ``modules``,
    also the Sphinx roles in their docstrings (:func:`check_roles`)."""
    pages: dict[Path, _Page] = {}
    for html in sorted(out.rglob("*.html")):
        page = _Page()
        page.feed(html.read_text(encoding="utf-8"))
        pages[html.resolve()] = page

    problems: list[str] = []
    for path, page in pages.items():
        rel = path.relative_to(out.resolve())
        for href in page.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue  # external links are not checked offline
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if target not in pages:
                if not target.exists():
                    problems.append(f"{rel}: link to a missing page: {href}")
                continue
            if parts.fragment and unquote(parts.fragment) not in pages[target].ids:
                problems.append(f"{rel}: link to a missing anchor: {href}")
        for code in page.unlinked_code:
            m = _DOTTED.fullmatch(code.strip())
            if m and not _resolves(m.group(1)):
                problems.append(f"{rel}: docstring cites {m.group(1)}, which does not exist")

    import descentlab

    top = pages.get((out / "descentlab.html").resolve())
    if top is None:
        problems.append("descentlab.html was not generated")
    else:
        problems += [
            f"descentlab.html: no entry for descentlab.__all__ name {name}"
            for name in descentlab.__all__
            if name not in top.ids
        ]
    if modules is not None:
        problems += check_roles(modules)
    return sorted(set(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "api", help="output folder")
    args = parser.parse_args(argv)
    block_network()
    start = time.perf_counter()
    modules, skipped = build(args.out)
    problems = check(args.out, modules)
    took = time.perf_counter() - start
    for note in skipped:
        print(f"api: skipped {note}", file=sys.stderr)
    for problem in problems:
        print(f"api: broken reference: {problem}", file=sys.stderr)
    print(f"api: {len(modules)} modules -> {args.out / 'index.html'} in {took:.1f} s, {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
