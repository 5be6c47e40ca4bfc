"""No module imports from a higher layer: schemas < activities < workflows < workers < keel.

Pure: every module's source is parsed (never imported) and each import of ours, wherever it
stands (top level, inside a function, under `TYPE_CHECKING`), is checked against its
importer's layer. schemas/ imports nothing of ours but schemas/; workflows/ may import
activities/ (the layer below) only for names, signatures and payload types, which this test
cannot tell from other uses and so does not try to.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("schemas", "activities", "workflows", "workers", "keel")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) for each import in the tree; relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def upward_imports() -> list[str]:
    """`file:line: importer (layer) imports name (higher layer)` for each violation."""
    problems: list[str] = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((ROOT / layer).rglob("*.py")):
            module = _module_name(path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, name in _imported(tree, module, path.name == "__init__.py"):
                top = name.split(".")[0]
                if top in LAYERS and LAYERS.index(top) > rank:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: {module} ({layer}) "
                                    f"imports {name} ({top}, a higher layer)")
    return problems


def test_no_module_imports_from_a_higher_layer() -> None:
    problems = upward_imports()
    assert not problems, "imports that go up a layer:\n" + "\n".join(problems)


def test_the_checker_sees_an_import_wherever_it_stands() -> None:
    # The checker itself: a top-level, a nested and a relative import are all found (a
    # relative one never leaves its package, so it names its own layer).
    source = ("import workflows.session\n"
              "def f():\n    from keel.client import KeelClient\n"
              "from ..text import clean\n")
    found = _imported(ast.parse(source), "activities.vault.store", is_package=False)
    assert sorted(found) == [(1, "workflows.session"), (3, "keel.client"),
                             (4, "activities.text")]
