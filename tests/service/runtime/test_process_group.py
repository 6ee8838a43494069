"""The pieces of `--processes N` that need no model: the shared change log, and a config that pickles into workers."""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from models.errors import InputError
from service.core.processes import CHANGE, PROCS, ProcessGroup, remove_process
from service.runtime.main import create_worker_app
from service.runtime.server import GuardedConfig, GuardedProtocol, server_config
from service.settings import ServiceSettings

PUBLISHERS, EACH = 4, 10


def test_concurrent_publishers_get_distinct_sequence_numbers(tmp_path: Path) -> None:
    groups = [ProcessGroup(tmp_path) for _ in range(PUBLISHERS)]
    got: list[int] = []
    lock = threading.Lock()

    def publish(group: ProcessGroup) -> None:
        for i in range(EACH):
            sequence = group.publish("reload", "admin", tmp_path / f"v{i}", f"v{i}")
            with lock:
                got.append(sequence)

    threads = [threading.Thread(target=publish, args=(g,)) for g in groups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(1, PUBLISHERS * EACH + 1))
    latest = groups[0].latest()
    assert latest is not None and latest.sequence == PUBLISHERS * EACH


def test_a_late_worker_catches_up_with_admin_changes_only(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    assert group.catch_up() is None  # nothing logged: settings.index
    bundle = tmp_path / "v2"
    bundle.mkdir()
    group.publish("reload", "admin", bundle, "v2")
    assert group.catch_up() == bundle
    group.publish("reload", "watch", bundle, "v2")
    assert group.catch_up() is None  # a watcher's change: the late worker loads CURRENT itself
    group.publish("rollback", "admin", tmp_path / "pruned", "pruned")
    assert group.catch_up() is None  # gone from disk: load the default, then follow (and report)


def test_status_lists_reporting_processes_and_skips_junk(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    assert group.processes() == []
    group.applied_to(3, "v1", "/b/v1")
    (tmp_path / PROCS / "999.json").write_text("{not json")
    (tmp_path / CHANGE).write_text("garbage")  # never half-written in service; still read as nothing logged
    assert [(p.version, p.applied) for p in group.processes()] == [("v1", 3)]
    assert group.latest() is None
    group.leave()
    assert [p.pid for p in group.processes()] == []


def test_each_collection_has_its_own_log_and_a_changed_one_starts_afresh(tmp_path: Path) -> None:
    root = ProcessGroup(tmp_path)  # the default collection's
    docs = root.collection("docs", "/b/docs\0/s")
    bundle = tmp_path / "v2"
    bundle.mkdir()
    docs.publish("reload", "admin", bundle, "v2")
    assert root.latest() is None and root.collection("docs", "/b/docs\0/s").catch_up() == bundle
    assert root.collection("docs", "/b/other\0/s").catch_up() is None  # its index changed: no old admin change
    assert root.collection("code", "/b/docs\0/s").catch_up() is None
    root.applied_to(0, "v1", "/b/v1")
    remove_process(tmp_path, docs.pid)  # the supervisor buries an exited process: it leaves every collection
    assert root.processes() == [] and docs.processes() == []


def test_the_worker_config_pickles_with_settings_and_hardening(tmp_path: Path) -> None:
    """Workers are spawned: the config, its app factory and the settings must survive pickling exactly."""
    settings = ServiceSettings(index=tmp_path / "b", student=tmp_path / "s", processes=2, header_timeout_s=3,
                               max_top_k=70, admin_token="tok")
    app = functools.partial(create_worker_app, settings, tmp_path)
    config = pickle.loads(pickle.dumps(server_config(app, settings, factory=True, workers=2)))
    assert isinstance(config, GuardedConfig) and config.http is GuardedProtocol
    assert (config.header_timeout_s, config.limit_concurrency, config.workers) == (3, settings.max_connections, 2)
    assert config.app.args[0] == settings
    assert config.app.args[0].admin_token.get_secret_value() == "tok"


def test_settings_warn_when_encoding_threads_outnumber_the_cores(tmp_path: Path) -> None:
    def plan(**threads: int) -> ServiceSettings:
        return ServiceSettings(index=tmp_path / "b", student=tmp_path / "s", **threads)

    assert plan().oversubscribed(cores=2) is None  # the default: one process, two worker threads
    assert plan(processes=2, workers=0).oversubscribed(cores=2) is None  # each event loop encodes
    assert plan(processes=2, workers=1).oversubscribed(cores=2) is None
    warning = plan(processes=2).oversubscribed(cores=2)  # two worker threads in each of two processes
    assert warning is not None and "= 4 on 2 core(s)" in warning and "TANDEM_WORKERS" in warning
    assert plan(workers=1, encode_threads=4).oversubscribed(cores=2) is not None


SWITCH = """
import sys
from pathlib import Path
from service.runtime.main import create_worker_app
from service.settings import ServiceSettings
where = Path(sys.argv[1])
create_worker_app(ServiceSettings(index=where / "b", student=where / "s", gil_switch_ms=0.5), where)
print(sys.getswitchinterval())
"""


def test_a_worker_process_holds_the_gil_switch_interval_of_its_settings(tmp_path: Path) -> None:
    """A spawned worker starts with Python's 5 ms; its app factory sets TANDEM_GIL_SWITCH_MS (a process of its own
    here, since the interval is process-wide)."""
    done = subprocess.run([sys.executable, "-c", SWITCH, str(tmp_path)], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[3])
    assert float(done.stdout.split()[-1]) == pytest.approx(0.0005)
    with pytest.raises(InputError, match="TANDEM_GIL_SWITCH_MS"):
        ServiceSettings(index=tmp_path / "b", student=tmp_path / "s", gil_switch_ms=0)
