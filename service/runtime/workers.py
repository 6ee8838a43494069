"""`tandem serve --processes N`: uvicorn's multiprocess supervisor, our app factory, one shared runtime directory.

The parent binds the port once (uvicorn's `Config.bind_socket`) and spawns N workers that inherit the
listening socket; the kernel hands each new connection to whichever worker accepts it. That is one
socket shared, not SO_REUSEPORT (one socket per process, which would let any process of the same user
join the port): it needs no socket option and is what uvicorn's supervisor does and restarts against.

Each worker is forked from a forkserver (multiprocessing's, started once, after the parent has set
PROMETHEUS_MULTIPROC_DIR) that imported the service's modules and nothing else: FastAPI, pydantic, FAISS, numpy,
bm25s, the tokenizers, our routes. It opens no file or model and starts no thread (onnxruntime, whose import starts
one, is imported by the worker when it makes its session; OpenBLAS's pool is stopped by its own fork handler), so
a worker shares no state with it or another worker, yet starts, is replaced, or is brought in by SIGHUP without
paying the two seconds of imports a fresh interpreter (uvicorn's spawn) paid each time. It unpickles the uvicorn
config as a spawned one did (the listening socket passed to it, as to a spawned one). The app
in it is `functools.partial(create_worker_app, settings, runtime)` (service.runtime.main hands the factory in, so the
supervisor knows no app): the validated ServiceSettings object
itself, so every worker gets exactly the parent's settings (never re-read from a changed environment),
and the config is service.runtime.server's GuardedConfig, so the timeouts, guarded protocol and
limit_concurrency hold in every worker (limit_concurrency per worker). The parent has already run the
student/bundle check (service.runtime.main) before any worker starts.

The runtime directory (service.core.processes) is made fresh, private (0700), before the first worker starts,
and removed when the supervisor exits; PROMETHEUS_MULTIPROC_DIR points into it, set in the parent's
environment so the workers inherit it before they import prometheus-client. When a worker exits, the
supervisor marks it dead for prometheus-client (its live gauges drop out) and removes its status file.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from socket import socket
from typing import Any

import uvicorn.supervisors.multiprocess as uvicorn_multiprocess
from prometheus_client.multiprocess import mark_process_dead
from uvicorn._subprocess import subprocess_started
from uvicorn.config import Config
from uvicorn.supervisors.multiprocess import Multiprocess

from service.core.processes import METRICS, remove_process
from service.metrics import MULTIPROC_DIR
from service.runtime.server import server_config
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

# How long a worker may take to answer the supervisor's ping before it is taken for hung and replaced (uvicorn:
# 5 s). A new worker answers only once it has imported onnxruntime, FAISS and the tokenizers, which on a cold
# or busy machine can take longer than 5 s: too short a limit would replace it over and over.
WORKER_HEALTHCHECK_S = 30


# What the forkserver imports before it forks a worker: the worker's app factory's module, and through it the
# service's (not onnxruntime: models.encoders.student imports it where it makes a session).
PRELOAD = ["service.runtime.main"]
_FORKSERVER = multiprocessing.get_context("forkserver")


# Makes the app of one worker process, in that process, from the parent's settings and the runtime directory; a
# module-level function, so that it pickles into the workers by name (service.runtime.main.create_worker_app).
AppFactory = Callable[[ServiceSettings, Path], Any]


class _Supervisor(Multiprocess):
    """uvicorn's supervisor (restarts a worker that dies) plus the bookkeeping of a worker's exit."""

    def __init__(self, config: Config, sockets: list[socket], runtime: Path) -> None:
        super().__init__(config, sockets)
        self._runtime = runtime

    def keep_subprocess_alive(self) -> None:
        """A dead or hung worker is replaced (uvicorn's own)."""
        before = {p.pid for p in self.processes}
        super().keep_subprocess_alive()
        self._bury(before - {p.pid for p in self.processes})

    def handle_signals(self) -> None:
        """SIGHUP replaces every worker, SIGTTOU retires one (uvicorn's own)."""
        before = {p.pid for p in self.processes}
        super().handle_signals()
        self._bury(before - {p.pid for p in self.processes})

    def _bury(self, pids: set[int | None]) -> None:
        for pid in pids:
            if pid is not None:
                log.info("worker process %d is gone: its live gauges and status dropped", pid)
                mark_process_dead(pid, str(self._runtime / METRICS))
                remove_process(self._runtime, pid)


def _worker_process(config: Config, target: Callable[..., None], sockets: list[socket]) -> BaseProcess:
    """uvicorn's `get_subprocess` (uvicorn._subprocess), forked from the forkserver instead of spawned."""
    try:
        stdin_fileno: int | None = sys.stdin.fileno()
    except (AttributeError, OSError):
        stdin_fileno = None
    return _FORKSERVER.Process(target=subprocess_started, kwargs={
        "config": config, "target": target, "sockets": sockets, "stdin_fileno": stdin_fileno})


@contextmanager
def _forked_workers() -> Iterator[None]:
    """uvicorn's supervisor makes each worker with the `get_subprocess` its module imported (spawn, hard-coded):
    while ours runs, that name is ours. The forkserver starts with the first worker, so it inherits the
    environment the parent has set by then, and stops when the parent exits (multiprocessing closes its pipe)."""
    _FORKSERVER.set_forkserver_preload(PRELOAD)
    spawned = uvicorn_multiprocess.get_subprocess
    uvicorn_multiprocess.get_subprocess = _worker_process  # type: ignore[assignment]
    try:
        yield
    finally:
        uvicorn_multiprocess.get_subprocess = spawned


def run_workers(settings: ServiceSettings, create_worker_app: AppFactory) -> None:
    """Serve with settings.processes worker processes until SIGINT/SIGTERM; the runtime directory goes with it."""
    runtime = Path(tempfile.mkdtemp(prefix="tandem-serve-"))
    try:
        (runtime / METRICS).mkdir()
        os.environ[MULTIPROC_DIR] = str(runtime / METRICS)
        app = functools.partial(create_worker_app, settings, runtime)
        config = server_config(app, settings, factory=True, workers=settings.processes,
                               timeout_worker_healthcheck=WORKER_HEALTHCHECK_S)
        sock = config.bind_socket()
        log.info("starting %d server processes on %s:%d (runtime directory %s)", settings.processes,
                 *sock.getsockname()[:2], runtime)
        try:
            with _forked_workers():
                _Supervisor(config, [sock], runtime).run()
        finally:
            sock.close()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
