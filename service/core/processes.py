"""What the processes of `tandem serve --processes N` share: one runtime directory, made by the parent.

An admin request lands on one process only, yet a reload or rollback must reach them all. So the
process that carried one out records it in a shared log, `change.json`: the newest change only
(sequence number, action, the bundle directory now served), written under an flock and replaced
atomically. Every process follows that log (service.core.follow) and applies a newer change itself;
each writes its own status file, `procs/PID.json` (version served, last change applied), which
`GET /admin/status` lists and the admin call waits on until every process has the change.

Changes made by a CURRENT-pointer watcher are logged too but not followed (each process's own
watcher follows the root); they are there so that a worker started later (uvicorn replaces one
that died) does not re-apply an older admin change over a newer pointer. Such a worker loads the
last admin change's bundle first (`catch_up`), so it joins on the version the others serve.

Each collection (service.core.collections) has a group of its own, so that a reload or rollback of one reaches every
process without touching the others: the default collection's is the runtime directory itself (as before
collections), every other one's a directory under RUNTIME/collections/, named by the collection and what it serves
(`ProcessGroup.collection`), so that a collection a config reload changes starts with a fresh change log.

Layout: RUNTIME/change.json, RUNTIME/change.lock, RUNTIME/procs/PID.json, the same under
RUNTIME/collections/NAME-KEY/, and RUNTIME/metrics/ (prometheus-client's multiprocess files,
PROMETHEUS_MULTIPROC_DIR). The parent creates it fresh before forking and removes it on exit.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from models.atomic import atomic_write
from models.manifest_io import utc_now
from service.core.outcomes import ProcessState, Trigger

log = logging.getLogger(__name__)

CHANGE = "change.json"
PROCS = "procs"
METRICS = "metrics"
COLLECTIONS = "collections"


class Change(BaseModel):
    """The newest reload or rollback of the group: after it, every process should serve `path`."""

    sequence: int
    action: Literal["reload", "rollback"]
    trigger: Trigger
    path: str
    pid: int
    at: str


class ProcessGroup:
    """One process's handle on the runtime directory: publish changes, read the newest, report its state."""

    def __init__(self, runtime: Path) -> None:
        self.runtime = runtime
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._applied = 0
        self._serving: tuple[str | None, str | None] = (None, None)  # version, path
        (runtime / PROCS).mkdir(parents=True, exist_ok=True)

    def collection(self, name: str, serves: str) -> ProcessGroup:
        """The group of collection `name` serving `serves` (its index and student, as declared): every process
        that serves the same gets the same directory."""
        key = hashlib.sha256(serves.encode()).hexdigest()[:16]
        return ProcessGroup(self.runtime / COLLECTIONS / f"{name}-{key}")

    @property
    def applied(self) -> int:
        with self._lock:
            return self._applied

    def publish(self, action: Literal["reload", "rollback"], trigger: Trigger, path: Path, version: str) -> int:
        """Log a change this process has just made (it has it applied); its sequence number."""
        with (self.runtime / "change.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            latest = self.latest()
            sequence = (latest.sequence if latest is not None else 0) + 1
            change = Change(sequence=sequence, action=action, trigger=trigger, path=str(path), pid=self.pid,
                            at=utc_now())
            atomic_write(self.runtime / CHANGE, lambda fh: fh.write(change.model_dump_json().encode()))
        self.applied_to(sequence, version, str(path))
        log.info("change %d (%s, %s) logged for the other processes: %s", sequence, action, trigger, version)
        return sequence

    def latest(self) -> Change | None:
        try:
            return Change.model_validate_json((self.runtime / CHANGE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:  # never half-written (atomic_write), so this is someone else's
            log.warning("cannot read the group's change log: %s", exc)
            return None

    def catch_up(self) -> Path | None:
        """The bundle a worker starting now should load first: the last admin change's (None: settings.index, also
        when the last change was a watcher's, which a new worker follows by loading CURRENT)."""
        latest = self.latest()
        if latest is None or latest.trigger == "watch" or not Path(latest.path).is_dir():
            return None  # a rollback target may have been pruned from disk: load the default, then follow
        log.info("starting on change %d's bundle %s", latest.sequence, latest.path)
        return Path(latest.path)

    def applied_to(self, sequence: int, version: str | None, path: str | None) -> None:
        """Record that this process has applied change `sequence` (or a later one) and serves `version`."""
        with self._lock:
            self._applied = max(self._applied, sequence)
            self._serving = (version, path)
            state = ProcessState(pid=self.pid, version=version, path=path, applied=self._applied,
                                 updated_at=utc_now())
            data = state.model_dump_json().encode()
            atomic_write(self.runtime / PROCS / f"{self.pid}.json", lambda fh: fh.write(data))

    def processes(self) -> list[ProcessState]:
        """Every process that has reported itself and not exited, by pid."""
        states = []
        for path in sorted((self.runtime / PROCS).glob("*.json")):
            try:
                states.append(ProcessState.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue  # removed meanwhile (its process exited)
        return sorted(states, key=lambda s: s.pid)

    def others_serve(self) -> bool:
        """Another live process of the group already serves a version: this one replaces a worker or joins late."""
        return any(state.version is not None and state.pid != self.pid for state in self.processes())

    def leave(self) -> None:
        """This process is stopping, or no longer serves the collection: the group no longer waits for it."""
        (self.runtime / PROCS / f"{self.pid}.json").unlink(missing_ok=True)


def remove_process(runtime: Path, pid: int) -> None:
    """Process `pid` has exited: it leaves the group of every collection (the supervisor's bookkeeping)."""
    for group in [runtime, *(runtime / COLLECTIONS).glob("*")]:
        (group / PROCS / f"{pid}.json").unlink(missing_ok=True)
