"""The code version of a job: a hash of the source it runs, so a change to the model code makes `train` stale and a
change to the README (or to a job that `train` never imports) does not.

A module's closure is itself plus every project module it imports, at any depth and wherever the import statement
stands (imports inside functions included): the import statements are read from the source with `ast`, never by
importing, so the answer does not depend on what happens to be loaded. Sources are read through the import system
(`importlib.util.find_spec(...).loader.get_source`), so the same hash comes out of a checkout and of the
`--py-files` zip that `make dist` builds.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from collections.abc import Iterable

# The project's own top-level packages; anything else (torch, pyspark ...) is pinned by requirements.txt.
PROJECT_PACKAGES = ("jobs", "hir_model", "udfs", "schemas")


def _is_project(name: str) -> bool:
    return name.split(".", 1)[0] in PROJECT_PACKAGES


def _source(module: str) -> str | None:
    """The module's source text, None when it is not a project module that can be found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_source"):
        return None
    try:
        return spec.loader.get_source(module)
    except ImportError:
        return None


def _imports(module: str, source: str) -> set[str]:
    """Project modules named by the import statements of `source` (relative imports resolved against `module`)."""
    is_package = importlib.util.find_spec(module).submodule_search_locations is not None
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from jobs import build_graph` names a submodule, `from jobs.x import f` a function: try both.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    out = set()
    for name in found:
        if not _is_project(name):
            continue
        parts = name.split(".")
        # Each parent package runs its __init__ on import: it is part of the closure too.
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in out if _source(m) is not None}


def sources(modules: Iterable[str]) -> dict[str, str]:
    """Every project module the given ones import, themselves included: name -> source, sorted by name."""
    found: dict[str, str] = {}
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in found:
            continue
        source = _source(module)
        if source is None:
            raise ValueError(f"no source for module {module}")
        found[module] = source
        todo.extend(_imports(module, source) - found.keys())
    return dict(sorted(found.items()))


def closure(modules: Iterable[str]) -> list[str]:
    """Every project module the given ones import, themselves included, sorted."""
    return list(sources(modules))


def code_version(*modules: str) -> str:
    """'src:<sha256 prefix>' over the closure's module names and sources."""
    digest = hashlib.sha256()
    for module, text in sources(modules).items():
        digest.update(module.encode() + b"\0" + text.encode() + b"\0")
    return "src:" + digest.hexdigest()[:16]
