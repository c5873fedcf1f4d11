"""Shared test set-up: tests that need the shared corpus skip when it is absent, and fixtures
shared by the GPU kernel test files."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest

import corpus
from corpus import CORPUS

from docqa.kernels.gpu import has_triton, interpreting


@pytest.fixture
def few_gemv_configs(monkeypatch):
    """Correctness, not speed, is checked here: autotuning the GEMVs over every config for each
    test shape compiled ~40 variants per shape and made the GPU run of these files take ~8 min
    (2026-11-30). Two configs still cover the one- and multi-iteration K loops."""
    if not has_triton() or interpreting():
        return
    from docqa.kernels.linear import triton_gemv

    for kernel in (triton_gemv._gemv_kernel, triton_gemv._qkv_gemv_kernel):
        monkeypatch.setattr(kernel, "configs", [c for c in kernel.configs
                                                if (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) in ((4, 1024), (16, 256))
                                                and c.num_stages == 2])



@pytest.fixture
def few_moe_configs(few_gemv_configs, monkeypatch):
    """As `few_gemv_configs`, for the MoE and FP8 kernels too (the GLM tests): two configs per
    autotuned kernel on the GPU, of different tile shapes."""
    if not has_triton() or interpreting():
        return
    from docqa.kernels.linear import triton_fp8
    from docqa.kernels.moe import triton_moe, triton_moe_fp8

    for kernel in (triton_moe._moe_gate_up_kernel, triton_moe._moe_down_kernel):
        monkeypatch.setattr(kernel, "configs", kernel.configs[:2])
    for kernel in (triton_fp8._fp8_gemv_kernel, triton_fp8._mm, triton_fp8._grouped,
                   triton_moe_fp8._fp8_moe_gate_up_kernel, triton_moe_fp8._fp8_moe_down_kernel):
        monkeypatch.setattr(kernel, "configs", [kernel.configs[0], kernel.configs[-1]])

# --- The shared corpus (../shared/corpus) is not in the repository. A fresh clone must pass its
# tests without it, so a test that reads it is skipped, with one line naming the corpus, when it
# is absent. "Reads it" is found from the code rather than from marks to keep in step: the test
# function, the fixtures it uses and the module functions they call (transitively) mention a
# module global whose value is a path under the corpus (or a collection of such), or the test is
# parametrized with such a path.

_ROOT = Path(__file__).resolve().parents[1]
CORPUS_MISSING = f"needs the shared corpus at {CORPUS}, which is absent"


def _under_corpus(value, depth: int = 0) -> bool:
    if isinstance(value, Path):
        value = value.resolve()
        return value == CORPUS or CORPUS in value.parents
    if isinstance(value, (list, tuple, set, frozenset)) and depth < 2:
        return any(_under_corpus(v, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 2:
        return any(_under_corpus(v, depth + 1) for v in value.values())
    return False


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _ours(module: types.ModuleType) -> bool:
    """A module of this repository (bench/, the package), not an installed library."""
    path = Path(getattr(module, "__file__", None) or "/").resolve()
    return _ROOT in path.parents and "site-packages" not in path.parts


def _reads_corpus(func, module_globals: dict, seen: set) -> bool:
    func = inspect.unwrap(getattr(func, "__func__", func))
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    if _under_corpus(list(getattr(func, "__defaults__", None) or ())):  # def f(gold=GOLD)
        return True
    names = _names(code)
    for name in names:
        value = module_globals.get(name)
        if isinstance(value, types.ModuleType) and _ours(value):
            # `bench_module.gold_spans()`: the attributes used of one of our own modules
            for attr in names:
                v = getattr(value, attr, None)
                if _under_corpus(v) or (isinstance(v, types.FunctionType) and _reads_corpus(v, v.__globals__, seen)):
                    return True
            continue
        if _under_corpus(value) or _under_corpus(vars(corpus).get(name)):  # also `from corpus import X` in a body
            return True
        if isinstance(value, types.FunctionType) and _reads_corpus(value, value.__globals__, seen):
            return True
    return False


def _needs_corpus(item: pytest.Item) -> bool:
    func = getattr(item, "obj", None)
    empty = item.get_closest_marker("skip")
    if empty is not None and str(empty.kwargs.get("reason", "")).startswith("got empty parameter set") \
            and func is not None and any(_under_corpus(v) for v in func.__globals__.values()):
        return True  # parametrized over corpus files (a glob of the corpus finds none)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and _under_corpus(list(callspec.params.values())):
        return True
    seen: set = set()
    if func is not None and _reads_corpus(func, func.__globals__, seen):
        return True
    defs = getattr(item, "_fixtureinfo", None)
    for name in (defs.names_closure if defs else ()):
        for fixturedef in defs.name2fixturedefs.get(name, ()):
            f = fixturedef.func
            if getattr(f, "__globals__", None) is not None and _reads_corpus(f, f.__globals__, seen):
                return True
    return False


def pytest_report_header(config) -> str:
    return f"corpus: {CORPUS} " + ("present" if CORPUS.is_dir() else "ABSENT: tests that read it are skipped")


_CORPUS_KEY = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config, items) -> None:
    if CORPUS.is_dir():
        return
    for item in items:
        item.stash[_CORPUS_KEY] = _needs_corpus(item)


@pytest.hookimpl(tryfirst=True)  # before the skip marks: a parametrize over corpus files is empty
def pytest_runtest_setup(item) -> None:
    # Skipped here rather than by a mark so that `-ra` folds them into one summary line with
    # their count ("SKIPPED [83] tests/conftest.py:…: needs the shared corpus …").
    if item.stash.get(_CORPUS_KEY, False):
        pytest.skip(CORPUS_MISSING)
