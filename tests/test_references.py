"""Prose names only what exists: what is not checked drifts, so it is checked like the imports.

Every mention below, found in the docstrings and comments of ``vpp/``, ``benchmarks/`` and ``examples/``
(every string statement and every ``#`` comment), in ``benchmarks/results/*.md``, ``benchmarks/**/*_notes.md``
and the README, must resolve; the tests list every one that does not, as ``file:line: mention (why)``.

* **Dotted names** ``vpp.a.b`` / ``benchmarks.a.b``: the longest importable module prefix, then the rest as
  attributes (so ``vpp.parallel.launch``, the function, resolves). ``vpp.x.*`` names the submodules of a
  package: ``vpp.x`` must be one.
* **Sphinx roles** in Python docstrings (``:func:`...```, ``:mod:``, ``:class:``, ``:data:``, ``:meth:``,
  ``:attr:``, ``:exc:``, ``:obj:``): a target with leading dots is relative to the module's package, as in an
  import (``.builders.x`` in ``vpp/schedules/y.py`` is ``vpp.schedules.builders.x``); a bare ``name`` or
  ``Name.attr`` is looked up in the mentioning module's namespace, then (a method named from its own
  class's docstrings) among the attributes of the classes that module defines; ``vpp.``/``benchmarks.``
  targets are dotted names as above; other absolute targets (``torch.x``) are not checked.
* **Repository paths** starting ``vpp/``, ``tests/``, ``benchmarks/``, ``examples/``, ``requirements/`` or
  ``.ci/``: exist under the repository root; ``*`` globs must match something; a ``:LINE`` suffix must be
  a line of the file.
* **Short paths**: any other word with a slash and a file suffix (``.py .md .json .txt .toml .png .yaml``),
  e.g. ``plan/order.py`` in a ``vpp`` docstring or ``results/memory.md`` in a benchmark, is checked when
  its first directory is one of ours (under the mentioning file's directory, ``vpp/`` or the repository
  root), and then must exist there; a first directory we do not have is another project's path
  (``vllm_ascend/worker/...``), and absolute paths and URLs are not repository paths: both are skipped.
* **Commands** ``python benchmarks/NAME.py``: the script exists, and, when it imports the ``benchmarks``
  package, the command is ``python -m benchmarks.NAME`` (or has ``PYTHONPATH=.`` before it): as a file
  without the checkout on the path it stops at ``import benchmarks``.
* An upper-case word standing for a name (``benchmarks.NAME``, ``benchmarks/NAME.py``) is a placeholder.
  Files a script writes only on hardware this repository has not run on are listed in :data:`NOT_YET`.

A mention is a word on its own: text glued to a letter, a dot, a slash or a dash on its left (a URL, an
absolute path, ``foo.vpp.x``) is not one.
"""

from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOTS = ("vpp/", "tests/", "benchmarks/", "examples/", "requirements/", ".ci/")
SUFFIXES = ("py", "md", "json", "txt", "toml", "png", "yaml", "yml")

# written by a script only where it can run; named as its output before any run exists
NOT_YET = {"benchmarks/results/device_check.md": "benchmarks/device_check.py writes it on a GPU or NPU"}

_LEFT = r"(?<![\w./-])"
DOTTED = re.compile(_LEFT + r"((?:benchmarks|vpp)(?:\.[A-Za-z_]\w*)+)(\.\*)?")
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|exc|obj):`~?([.\w]+)`")
REPO_PATH = re.compile(_LEFT + r"((?:\./)?(?:" + "|".join(re.escape(r) for r in ROOTS) + r")[\w.*/-]*)(:\d+)?")
COMMAND = re.compile(r"(PYTHONPATH=\.\s+)?python\s+benchmarks/(\w+)\.py")
SHORT_PATH = re.compile(_LEFT + r"((?:\.\.?/)*[\w-]+(?:/[\w.*-]+)*/[\w*-]+\.(?:" + "|".join(SUFFIXES) + r"))\b(:\d+)?")


# --- where the prose is -----------------------------------------------------------------------------

def _python_prose(path: pathlib.Path) -> list[tuple[int, str]]:
    """(first line, raw text) of every string statement (docstrings included) and every comment."""
    source = path.read_text()
    spans = [(n.lineno, n.col_offset, n.end_lineno, n.end_col_offset) for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and any((a, b) <= tok.start and tok.end <= (c, d) for a, b, c, d in spans):
            out.append((tok.start[0], tok.string))
    return out


def _sources() -> list[pathlib.Path]:
    files = []
    for top in ("vpp", "benchmarks", "examples"):
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def _markdown(include_readme: bool) -> list[pathlib.Path]:
    files = sorted((ROOT / "benchmarks" / "results").glob("*.md")) + sorted((ROOT / "benchmarks").rglob("*_notes.md"))
    return [ROOT / "README.md"] if include_readme else files


# --- resolving ----------------------------------------------------------------------------------------

def _module_name(path: pathlib.Path) -> str | None:
    rel = path.relative_to(ROOT).with_suffix("")
    if rel.parts[0] not in ("vpp", "benchmarks"):
        return None
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _load(path: pathlib.Path):
    name = _module_name(path)
    if name is not None:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(f"_refcheck_{path.stem}", path)  # examples/: not a package
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve_dotted(name: str, package: bool = False) -> str | None:
    """None when ``name`` resolves, else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name is not None and not ".".join(parts[:cut]).startswith(e.name):
                return f"importing {'.'.join(parts[:cut])} fails: {e}"
            continue
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:i])} has no {attr!r}"
            obj = getattr(obj, attr)
        if package and not hasattr(obj, "__path__"):
            return f"{name} is not a package"
        return None
    return f"no module {parts[0]}"


def _resolve_role(target: str, path: pathlib.Path, module) -> str | None:
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        name = _module_name(path)
        if name is None:
            return "a relative name outside a package"
        pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        if dots - 1 > len(pkg) - 1:
            return "more leading dots than packages"
        base = pkg[:len(pkg) - (dots - 1)]
        return _resolve_dotted(".".join(base + target.lstrip(".").split(".")))
    head = target.split(".")[0]
    if head in ("vpp", "benchmarks"):
        return _resolve_dotted(target)
    if module is None:
        return "no module namespace to look it up in"
    if "." in target and head not in vars(module):
        return None  # another project's absolute name (torch.x, transformers.x): not ours to check
    classes = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    for obj in [module] + classes:
        for attr in target.split("."):
            if not hasattr(obj, attr):
                break
            obj = getattr(obj, attr)
        else:
            return None
    return f"neither {module.__name__} nor a class it defines has {target!r}"


def _ours(mention: str, bases: list[pathlib.Path]) -> bool:
    """Whether a short path's first directory (after any ``../``) is one of this repository's."""
    ups = len(re.match(r"(?:\.\.?/)*", mention).group(0).replace("./", "").split(".")) - 1
    first = mention.lstrip("./").split("/")[0]
    return any((base.joinpath(*[".."] * ups) / first).resolve().is_dir() for base in bases)


def _resolve_path(mention: str, line: str | None, bases: list[pathlib.Path]) -> str | None:
    mention = mention.rstrip(".")
    if mention in NOT_YET:
        return None
    for base in bases:
        target = base / mention
        hits = [pathlib.Path(p) for p in glob.glob(str(target))] if "*" in mention else [target] * target.exists()
        if hits:
            if line is not None:
                n = int(line[1:])
                f = hits[0]
                if f.is_dir() or n < 1 or n > len(f.read_text().splitlines()):
                    return f"{f.relative_to(ROOT)} has no line {n}"
            return None
    return "no such file" + (" or directory" if not mention.endswith(tuple("." + s for s in SUFFIXES)) else "")


def _placeholder(mention: str) -> bool:
    return any(len(w) > 1 and w.isupper() for w in re.split(r"[./]", mention))


# --- one file -----------------------------------------------------------------------------------------

def _check_text(path: pathlib.Path, start: int, text: str, module, problems: list[str]) -> None:
    rel = path.relative_to(ROOT)

    def report(offset: int, mention: str, why: str | None) -> None:
        if why is not None:
            problems.append(f"{rel}:{start + text.count(chr(10), 0, offset)}: {mention} ({why})")

    for m in DOTTED.finditer(text):
        name = m.group(1).rstrip(".")
        if name.endswith((".py", ".md")) or _placeholder(name):  # a file name, checked as a path
            continue
        report(m.start(), m.group(0), _resolve_dotted(name, package=bool(m.group(2))))
    if path.suffix == ".py":
        for m in ROLE.finditer(text):
            if DOTTED.fullmatch(m.group(1)):
                continue  # checked as a dotted name
            report(m.start(), m.group(1), _resolve_role(m.group(1), path, module))
    for m in REPO_PATH.finditer(text):
        if _placeholder(m.group(1)):
            continue
        report(m.start(), m.group(0), _resolve_path(m.group(1).removeprefix("./"), m.group(2), [ROOT]))
    for m in COMMAND.finditer(text):
        script = ROOT / "benchmarks" / f"{m.group(2)}.py"
        if not m.group(1) and not _placeholder(m.group(2)) and script.exists() and \
                re.search(r"^\s*(from|import) benchmarks\b", script.read_text(), re.M):
            report(m.start(), m.group(0), f"imports the benchmarks package: python -m benchmarks.{m.group(2)}")
    bases = [path.parent, ROOT / "vpp", ROOT]
    for m in SHORT_PATH.finditer(text):
        if m.group(1).startswith(ROOTS) or m.group(1).startswith("./") or not _ours(m.group(1), bases):
            continue
        report(m.start(), m.group(0), _resolve_path(m.group(1), m.group(2), bases))


def _problems(files: list[pathlib.Path]) -> list[str]:
    problems: list[str] = []
    for path in files:
        if path.suffix == ".py":
            prose = _python_prose(path)
            # the module's namespace, for bare role targets (``__main__`` would run the command line)
            module = _load(path) if path.name != "__main__.py" and any(ROLE.search(t) for _, t in prose) else None
            for start, text in prose:
                _check_text(path, start, text, module, problems)
        else:
            _check_text(path, 1, path.read_text(), None, problems)
    return problems


def test_docstrings_comments_and_results_name_what_exists():
    problems = _problems(_sources() + _markdown(include_readme=False))
    problems += [f"{p} exists now: remove it from NOT_YET" for p in NOT_YET if (ROOT / p).exists()]
    assert not problems, f"{len(problems)} mentions do not resolve:\n" + "\n".join(problems)


def test_readme_names_what_exists():
    problems = _problems(_markdown(include_readme=True))
    assert not problems, f"{len(problems)} mentions do not resolve:\n" + "\n".join(problems)


@pytest.mark.parametrize("text, bad", [
    ("see vpp.schedules.ir.Plan and vpp/schedules/ir.py", False),
    ("see vpp.schedules.no_such_module", True),
    ("see vpp.schedules.ir.NoSuchName", True),
    ("vpp.schedules.* modules", False),
    ("vpp.schedules.ir.* modules", True),  # a module, not a package
    ("vpp/no_such_dir/", True),
    ("benchmarks/results/*.md", False),
    ("benchmarks/results/*.nothing", True),
    ("vpp/schedules/ir.py:1", False),
    ("vpp/schedules/ir.py:100000", True),
    ("schedules/ir.py and ../perf/arch.py", False),  # relative to vpp/, and to the mentioning file's directory
    ("schedules/no_such.py", True),
    ("https://github.com/x/y/blob/main/vpp/nothing.py and /abs/vpp/nothing.py", False),
    (":func:`.ir.chunk_requests` and :class:`Plan`", False),  # relative to vpp.schedules; Plan in vpp.schedules.ir's namespace
    (":func:`.no_such.f`", True),
    (":func:`no_such_name`", True),
    (":class:`torch.nn.Module`", False),
    (":meth:`admission_gate` of a Plan", False),  # an attribute of a class the module defines
    ("benchmarks.NAME and benchmarks/NAME.py", False),  # placeholders
    ("vllm_ascend/worker/model_runner_v1.py and model_dir/config.json", False),  # not our directories
    ("../no_such_dir/x.md", False),
    ("../perf/no_such.py", True),
    ("python benchmarks/device_check.py", True),  # imports the benchmarks package
    ("PYTHONPATH=. python benchmarks/device_check.py, python -m benchmarks.device_check", False),
    ("python benchmarks/stream_sim.py", False),  # imports vpp only: runs as a file
])
def test_the_rules(text, bad):
    """The checker itself: each rule accepts what exists and refuses what does not."""
    problems: list[str] = []
    path = ROOT / "vpp" / "schedules" / "ir.py"
    _check_text(path, 1, text, importlib.import_module("vpp.schedules.ir"), problems)
    assert bool(problems) == bad, problems
