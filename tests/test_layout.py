"""The layers import only downward: `pipelines` (pure document work) knows neither the app
nor the engine, the engine knows neither the app nor the pipelines, and the store only
writes the records the ingest side builds (it imports none of its builders).

Read from the source (every import statement, those inside functions too), so an import
that runs only on some path is caught as well as one at the top of a file.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    """The absolute `docqa.…` module names a file imports (relative imports resolved)."""
    package = ["docqa", *path.relative_to(ROOT).with_suffix("").parts[:-1]]
    if path.name == "__init__.py":
        package = ["docqa", *path.relative_to(ROOT).parts[:-1]]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:  # `from . import x`: x is a module of the package
                out |= {f"{module}.{a.name}" for a in node.names}
            else:
                out.add(module)
    return {m for m in out if m == "docqa" or m.startswith("docqa.")}


def offenders(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = sorted(m for m in imports(path) if m.startswith(forbidden))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_scanner_resolves_relative_imports():
    # Known imports of known files, so the checks below cannot pass by seeing nothing.
    assert "docqa.pipelines.ingest.source" in imports(ROOT / "app" / "clikit.py")
    assert "docqa.pipelines.document" in imports(ROOT / "pipelines" / "ingest" / "passages.py")
    assert "docqa.pipelines.answer.prompt" in imports(ROOT / "pipelines" / "answer" / "qa.py")
    assert offenders("app", ("docqa.pipelines",))  # the app does use the pipelines


def test_pipelines_import_neither_app_nor_engine():
    assert offenders("pipelines", ("docqa.app", "docqa.engine", "docqa.kernels")) == {}


def test_engine_imports_neither_app_nor_pipelines():
    assert offenders("engine", ("docqa.app", "docqa.pipelines")) == {}
    assert offenders("kernels", ("docqa.app", "docqa.pipelines")) == {}


def test_the_store_builds_no_records():
    """The store writes what `pipelines.ingest.record` built and reads it back: of the
    pipelines it knows only the models, the full-text search text and the errors."""
    used = {m for m in imports(ROOT / "app" / "store.py") if m.startswith("docqa.pipelines")}
    assert used <= {"docqa.pipelines.document", "docqa.pipelines.fulltext", "docqa.pipelines.errors"}, used


def test_the_ingest_side_does_not_reach_into_the_answer_side():
    # Ingest runs before any question; only the answer side may read the ingest side's
    # modules (section keys, anchor parsers), never the other way round.
    assert offenders("pipelines/ingest", ("docqa.pipelines.answer",)) == {}
