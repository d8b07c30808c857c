"""Which modules a source file imports, read from its text (ast), wherever in the file the import sits.

The layering test (which imports are allowed) and the architecture test (which are drawn) read imports alike.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module a file imports, wherever in the file the import sits (see imported_by)."""
    return imported_by(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")


def imported_by(source: str, module: str, is_package: bool) -> set[str]:
    """Every module `source` (the module `module`) imports: import statements, relative ones made absolute, and
    `importlib.import_module` or `__import__` called with a literal name."""
    package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.module or "", node.level, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _imports_by_name(node.func):
            name = _literal(node.args[0] if node.args else None)
            if name is not None:
                names.add(_named_import(node, name, package))
    return names


def absolute(name: str, level: int, package: str) -> str:
    """The absolute name of `from <level dots><name> import ...` inside `package`."""
    if level == 0:
        return name
    base = ".".join(package.split(".")[: len(package.split(".")) - level + 1])
    return f"{base}.{name}" if name else base


def _imports_by_name(func: ast.expr) -> bool:
    """importlib.import_module, import_module (imported from importlib) or __import__."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def _named_import(call: ast.Call, name: str, package: str) -> str:
    """The module an import by literal name loads: a relative name is import_module's, against its `package`."""
    dots = len(name) - len(name.lstrip("."))
    if not dots:
        return name
    given = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "package")]
    anchor = _literal(given[0]) if given else None
    return absolute(name[dots:], dots, anchor or package)


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
