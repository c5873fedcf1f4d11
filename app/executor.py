"""Where review tasks run: a tiny interface, so a job runner can change without the job.

`Executor.map(fn, tasks)` calls `fn(task)` for every task and yields `(task, result)` as
each finishes, in any order. `fn` must be a module-level function and tasks plain data
(picklable), because an executor may run them in other processes or on other machines.

`shares_database` says whether `fn` may open the job's SQLite file itself. The local
executors run on this machine, so their workers store their own answers and only a small
summary travels back. `RayExecutor`'s workers may be on other machines, and SQLite's
locking does not hold over a network filesystem, so the driver alone touches the database:
it ships each task's inputs and writes what comes back (see `app.review`).

Local choice, measured on this project's 2-core machine: an evidence-only review item
takes about 20 ms (retrieval over stored passages), less than a spawned worker takes to
import the package, so `SerialExecutor` (in process) is the default; with a model loaded
the engine is already multi-threaded and one process holds the weights once, so it stays
serial too. `ProcessExecutor` is there for large evidence-only jobs (`--workers N`), and
`RayExecutor` for many documents with a model on a cluster (one model per worker).
`ThreadExecutor` runs a job's model work on threads of this process when the engine batches
(a CUDA decoder: `LoadedEngine.batched`): each thread answers one item as it would alone, and
the engine decodes all their requests together.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from typing import Protocol, TypeVar

from .errors import DocqaError

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    shares_database: bool

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]: ...


class SerialExecutor:
    """Runs tasks one after another in this process."""

    shares_database = True

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        for task in tasks:
            yield task, fn(task)


class ProcessExecutor:
    """Runs tasks in a pool of worker processes (spawned: no SQLite handle is inherited).

    At most `workers * 2` tasks are in flight, so a job interrupted early has not queued
    work it will never see finish."""

    shares_database = True

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or (os.cpu_count() or 1))

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield from _windowed(pool, fn, tasks, self.workers * 2)


class ThreadExecutor:
    """Runs tasks on threads of this process, at most `threads` at once. Its tasks do not
    share the database (`app.review`'s and `app.summarize`'s driver path): retrieval and
    storing stay on the calling thread, one SQLite connection, and the threads do the model's
    work, which the engine batches across them."""

    shares_database = False

    def __init__(self, threads: int):
        self.threads = max(1, threads)

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        with ThreadPoolExecutor(self.threads, thread_name_prefix="docqa-item") as pool:
            yield from _windowed(pool, fn, tasks, self.threads)


def _windowed(pool, fn: Callable[[T], R], tasks: Iterable[T], window: int) -> Iterator[tuple[T, R]]:
    """(task, fn(task)) from `pool` as each finishes, with at most `window` tasks submitted and
    not yet yielded (tasks are drawn from the iterable only as room frees)."""
    pending: dict = {}
    todo = iter(tasks)
    for task in todo:
        pending[pool.submit(fn, task)] = task
        if len(pending) >= window:
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


class ClusterError(DocqaError):
    """Ray is missing, the cluster cannot be reached, or workers keep dying."""


INSTALL_CLUSTER = "--executor ray needs the cluster extra: pip install 'docqa[cluster]'"


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(INSTALL_CLUSTER) from None
    return ray


class _Worker:
    """A Ray actor: one long-lived process that runs tasks one at a time. Whatever `fn`
    caches per process (the loaded model, its prefix cache, the documents it has been
    sent) stays loaded for the actor's life, so each worker loads the model once."""

    def __init__(self) -> None:
        self._shared: tuple[str, object] | None = None

    def run(self, fn: Callable, task):
        if isinstance(task, dict):
            task = {k: self._resolve(v) for k, v in task.items()}
        return os.getpid(), fn(task)

    def _resolve(self, value):
        # A value put once with `RayExecutor.share` (a document sent with each of its
        # items): fetched from the object store once per actor, not once per task.
        import ray

        if not isinstance(value, ray.ObjectRef):
            return value
        if self._shared is None or self._shared[0] != value.hex():
            self._shared = (value.hex(), ray.get(value))
        return self._shared[1]


class RayExecutor:
    """Runs tasks on a pool of Ray actors: one per GPU when `gpus` (each holds a model on
    its GPU), else one per CPU; `workers` overrides the count.

    `address`: None starts a local cluster for this process (stopped on `close()`), "auto"
    joins the cluster `ray start` made on this machine, `ray://HOST:PORT` a remote one; a
    process that already called `ray.init()` keeps its cluster. At most `in_flight` tasks
    per worker are submitted at once (backpressure: a job over ten thousand documents
    never queues them all). A task whose worker process dies is submitted again, up to
    `retries` times, while Ray restarts the actor; `lost` counts those resubmissions and
    `pids` holds every worker process that returned a result."""

    shares_database = False

    def __init__(self, address: str | None = None, workers: int | None = None, *, gpus: bool = False,
                 retries: int = 3, in_flight: int = 2):
        self.address, self.workers, self.gpus = address, workers, gpus
        self.retries, self.in_flight = retries, in_flight
        self.lost = 0
        self.pids: set[int] = set()
        self._actors: list = []
        self._started = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _connect(self):
        ray = _ray()
        if not ray.is_initialized():
            # Quiet: no dashboard, no worker log lines mixed into the progress bar
            # (a worker's exception still comes back with its task).
            kwargs = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            if self.address is None:
                kwargs["num_cpus"] = self.workers or os.cpu_count() or 1
            try:
                ray.init(address=self.address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                where = self.address or "a local cluster"
                raise ClusterError(f"cannot start or reach Ray at {where}: {str(e).splitlines()[0]}") from None
            self._started = True
        if not self._actors:
            resources = ray.cluster_resources()
            use_gpu = self.gpus and resources.get("GPU", 0) >= 1
            n = self.workers or max(1, int(resources.get("GPU" if use_gpu else "CPU", 1)))
            actor = ray.remote(_Worker).options(
                num_cpus=0 if use_gpu else 1, num_gpus=1 if use_gpu else 0,
                max_restarts=-1, max_task_retries=0)
            self._actors = [actor.remote() for _ in range(n)]
        return ray

    def share(self, value):
        """A handle for a value many tasks carry (put once, fetched once per worker)."""
        return self._connect().put(value)

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[T, R]]:
        ray = self._connect()
        from ray.exceptions import (ActorUnavailableError, ObjectLostError, RayActorError, RayTaskError,
                                    WorkerCrashedError)

        lost_worker = (RayActorError, ActorUnavailableError, WorkerCrashedError, ObjectLostError)
        load = [0] * len(self._actors)
        pending: dict = {}  # ObjectRef -> (task, actor index, attempts)

        def submit(task, attempts: int) -> None:
            a = min(range(len(load)), key=load.__getitem__)
            load[a] += 1
            pending[self._actors[a].run.remote(fn, task)] = (task, a, attempts)

        todo = iter(tasks)
        cap = self.in_flight * len(self._actors)
        try:
            for task in todo:
                submit(task, 0)
                if len(pending) >= cap:
                    break
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                task, a, attempts = pending.pop(ref)
                load[a] -= 1
                try:
                    pid, result = ray.get(ref)
                except RayTaskError as e:  # fn raised: the same error as in process, not Ray's wrapper
                    raise (e.cause if isinstance(e.cause, Exception) else e) from None
                except lost_worker as e:
                    if attempts >= self.retries:
                        raise ClusterError(f"a task failed on {attempts + 1} workers in turn; last: "
                                           f"{str(e).splitlines()[0]}") from None
                    self.lost += 1
                    submit(task, attempts + 1)
                    continue
                self.pids.add(pid)
                nxt = next(todo, None)
                if nxt is not None:
                    submit(nxt, 0)
                yield task, result
        finally:
            for ref in pending:  # an abandoned map (error, Ctrl-C): drop what is queued
                try:
                    ray.cancel(ref)
                except Exception:  # already finished, or its actor is gone
                    pass

    def close(self) -> None:
        if not self._actors and not self._started:
            return
        ray = _ray()
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        if self._started:
            ray.shutdown()
            self._started = False
