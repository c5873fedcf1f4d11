"""Where review tasks run: a tiny interface, so a job runner can change without the job.

`Executor.map(fn, tasks)` calls `fn(task)` for every task and yields `(task, result)` as
each finishes, in any order. `fn` must be a module-level function and tasks plain data
(picklable), because an executor may run them in other processes or on other machines;
each call does its own storing, so nothing but a small summary travels back.

Local choice, measured on this project's 2-core machine: an evidence-only review item
takes about 20 ms (retrieval over stored passages), less than a spawned worker takes to
import the package, so `SerialExecutor` (in process) is the default; with a model loaded
the engine is already multi-threaded and one process holds the weights once, so it stays
serial too. `ProcessExecutor` is there for large evidence-only jobs (`--workers N`).

A Ray executor would implement the same method: `ray.remote(fn)`, submit one remote call
per task, and `ray.wait` to yield them as they finish; the workers open the same SQLite
file (or a shared store) by path, exactly as `ProcessExecutor`'s workers do.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]: ...


class SerialExecutor:
    """Runs tasks one after another in this process."""

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        for task in tasks:
            yield task, fn(task)


class ProcessExecutor:
    """Runs tasks in a pool of worker processes (spawned: no SQLite handle is inherited).

    At most `workers * 2` tasks are in flight, so a job interrupted early has not queued
    work it will never see finish."""

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or (os.cpu_count() or 1))

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        ctx = multiprocessing.get_context("spawn")
        pending: dict = {}
        todo = iter(tasks)
        with ProcessPoolExecutor(self.workers, mp_context=ctx) as pool:
            for task in todo:
                pending[pool.submit(fn, task)] = task
                if len(pending) >= self.workers * 2:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    task = pending.pop(fut)
                    nxt = next(todo, None)
                    if nxt is not None:
                        pending[pool.submit(fn, nxt)] = nxt
                    yield task, fut.result()


def local_executor(workers: int = 1) -> Executor:
    return SerialExecutor() if workers <= 1 else ProcessExecutor(workers)
