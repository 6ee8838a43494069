"""`tandem serve`: refuse an incompatible student/bundle pair up front, then run uvicorn (one process, or a
supervisor and TANDEM_PROCESSES workers: service.workers)."""

from __future__ import annotations

import logging

import uvicorn

from service.app import create_app
from service.heap import freeze_startup_heap
from service.loader import check_compatible
from service.logs import configure_logging
from service.server import server_config
from service.settings import ServiceSettings, available_cores
from service.workers import run_workers

log = logging.getLogger(__name__)


def run_server(settings: ServiceSettings) -> None:
    """Raises ContractMismatch (exit 2 from the CLI) before binding the port, or starting any worker process, if
    the pair does not match."""
    configure_logging(settings.log_format, settings.log_level)
    bundle, student = check_compatible(settings)
    log.info("serving %s (%d docs, %d-d %s) with student %s (%s, teacher %s)", settings.index, bundle.count,
             bundle.dim, bundle.quantization.value, settings.student, settings.student_precision, student.teacher.name)
    if (warning := settings.oversubscribed(available_cores())) is not None:
        log.warning("%s", warning)
    if settings.processes > 1:
        run_workers(settings)
        return
    # Our handler formats uvicorn's loggers too; service.middleware writes the access log (with request ids).
    app = create_app(settings)
    freeze_startup_heap()  # the bundle loads later, in the app's lifespan: it stays collectable
    uvicorn.Server(server_config(app, settings)).run()
