"""Rules the source keeps, checked on the files themselves: no module of ``skyward/`` over 400
lines, and tests and benchmarks that use skyward through its public names only.

A test may import any module path (``skyward.protocol.payload``, ``skyward._retry``), but
touches no ``_``-prefixed name (attribute, function, class, variable) of a skyward object: what
it needs from inside is public, or comes from the one documented test hook,
:mod:`skyward.testing`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "skyward"
LIMIT = 400


def line_counts() -> dict[str, int]:
    return {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_of_skyward_is_over_400_lines() -> None:
    over = {path: n for path, n in line_counts().items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them along a seam): {over}"


# -- public names only in tests/ and bench/ -------------------------------------------------------
def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_names(paths: list[Path]) -> set[str]:
    """Every private name skyward defines: functions, classes, variables, attributes it sets."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if private(n)}


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` (``skyward.x.y``) names a module or package of this checkout."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def foreign_names(tree: ast.Module) -> set[str]:
    """Names the file binds by importing something that is not skyward (``os``, ``torch``, its own
    helpers): their private attributes are none of skyward's business."""
    names = {"self", "cls"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "skyward":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] != "skyward"):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def private_uses(path: Path, skyward_private: set[str]) -> Iterator[str]:
    """``from skyward... import _x`` (``_x`` not a module), ``obj._x`` and ``getattr(obj, "_x")`` where
    ``_x`` is a private name skyward defines and ``obj`` is not ``self``/``cls`` nor a name bound
    by a foreign import (the tests' own helpers, ``os``, ``torch``)."""
    tree = ast.parse(path.read_text(), str(path))
    foreign = foreign_names(tree)
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "skyward":
            for alias in node.names:
                if private(alias.name) and not is_module(f"{node.module}.{alias.name}"):
                    yield f"{where}:{node.lineno}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute) and private(node.attr):
            name = node.attr
            if name in skyward_private and root_name(node.value) not in foreign:
                yield f"{where}:{node.lineno}: {ast.unparse(node)}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and node.args[1].value in skyward_private):
            yield f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"


def test_tests_and_benchmarks_touch_no_private_name_of_skyward() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    modules = {p.stem for p in sources} | {p.parent.name for p in sources if p.name == "__init__.py"}
    skyward_private = defined_names(sources) - {m for m in modules if private(m)}
    checked = sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")])
    found = sorted((use for path in checked for use in private_uses(path, skyward_private)),
                   key=lambda use: (use.split(":")[0], int(use.split(":")[1])))
    assert not found, ("private names of skyward used by tests or benchmarks (use a public name, or add it to "
                       "skyward.testing):\n  " + "\n  ".join(found))


def test_the_private_name_check_sees_each_kind_of_use(tmp_path: Path) -> None:
    """The scan itself: an import, an attribute through a skyward module or any object, getattr;
    not a dunder, not a private module path, not a foreign module's private name, not ``self``'s."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "from skyward.protocol import payload\n"
        "from skyward.protocol.payload import _plain\n"
        "from skyward.torch import _backend\n"
        "import skyward._retry\n"
        "def f(pool):\n"
        "    pool._nodes.start()\n"
        "    payload._plain(1)\n"
        "    getattr(pool, '_state')\n"
        "    os._exit(0)\n"
        "    pool.__class__\n"
        "    self._nodes\n"
    )
    uses = [use.split(": ", 1)[1] for use in private_uses(sample, {"_plain", "_nodes", "_state", "_exit"})]
    assert sorted(uses) == sorted(["from skyward.protocol.payload import _plain", "pool._nodes", "payload._plain",
                                   "getattr(..., '_state')"])
