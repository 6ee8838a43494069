"""`tandem serve`: refuse an incompatible student/bundle pair up front, then run uvicorn (one process, or a
supervisor and TANDEM_PROCESSES workers: service.runtime.workers, each making its app with `create_worker_app`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from service.core.loader import check_compatible
from service.core.processes import METRICS, ProcessGroup
from service.http.app import create_app
from service.metrics import MULTIPROC_DIR
from service.runtime.descriptors import raise_descriptor_limit
from service.runtime.heap import freeze_startup_heap
from service.runtime.logs import configure_logging
from service.runtime.server import server_config
from service.runtime.workers import run_workers
from service.settings import ServiceSettings, available_cores

log = logging.getLogger(__name__)


def run_server(settings: ServiceSettings) -> None:
    """Raises ContractMismatch (exit 2 from the CLI) before binding the port, or starting any worker process, if
    the pair does not match."""
    configure_logging(settings.log_format, settings.log_level)
    sys.setswitchinterval(settings.gil_switch_ms / 1e3)
    raise_descriptor_limit()  # before any worker starts: they inherit it (service.runtime.descriptors)
    specs = settings.collection_specs()
    for spec in specs:
        own = settings.model_copy(update={"index": spec.index, "student": spec.student})
        try:
            bundle, student = check_compatible(own)
        except Exception as exc:
            if len(specs) == 1:
                raise
            # one of several: it is reported (its loader fails, /readyz and GET /collections say why) while the
            # others serve
            log.error("collection %s will not serve: %s", spec.name, exc)
            continue
        log.info("serving %s: %s (%d docs, %d-d %s) with student %s (%s, teacher %s)", spec.name, spec.index,
                 bundle.count, bundle.dim, bundle.quantization.value, spec.student, settings.student_precision,
                 student.teacher.name)
    if (warning := settings.oversubscribed(available_cores())) is not None:
        log.warning("%s", warning)
    if settings.processes > 1:
        run_workers(settings, create_worker_app)
        return
    # Our handler formats uvicorn's loggers too; service.http.middleware writes the access log (with request ids).
    app = create_app(settings)
    freeze_startup_heap()  # the bundle loads later, in the app's lifespan: it stays collectable
    uvicorn.Server(server_config(app, settings)).run()


def create_worker_app(settings: ServiceSettings, runtime: Path) -> FastAPI:
    """The app of one worker process of `--processes N` (called in the worker: its logging is configured here, as
    in the parent); service.runtime.workers pickles it by name into each worker."""
    configure_logging(settings.log_format, settings.log_level)
    sys.setswitchinterval(settings.gil_switch_ms / 1e3)  # a forked worker starts with the forkserver's: the default
    os.environ[MULTIPROC_DIR] = str(runtime / METRICS)  # this supervisor's, whatever the forkserver inherited
    app = create_app(settings, ProcessGroup(runtime))
    freeze_startup_heap()  # the bundle loads later, in the app's lifespan: it stays collectable
    return app
