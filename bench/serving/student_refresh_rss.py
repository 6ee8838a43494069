"""The server's resident memory across student changes (issue 55, deliverable 6): `tandem serve` on a bundle root and
a student root, then CHANGES times the student root's CURRENT moved to another copy of the student and a reload
(what `tandem index follow --refresh-student` leads to), each followed by a few searches; VmRSS after each.

Run it against another tree with PYTHONPATH (the server inherits it) to compare. The student copies are hard links
(one file on disk, a session each in the server: the pool is keyed by directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from models.bundle.versions import set_current
from models.encoders.student_root import set_current_student

TOKEN = "bench-admin-token"
STUDENT_FILES = ("student.json", "model.int8.onnx", "tokenizer.json")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(bundle: Path, student: Path, changes: int, keep: int, work: Path) -> dict[str, object]:
    root, students = work / "root", work / "students"
    shutil.copytree(bundle, root / "v1")
    set_current(root, "v1")
    for i in range(changes + 1):
        (students / f"s{i}").mkdir(parents=True)
        for name in STUDENT_FILES:
            os.link(student / name, students / f"s{i}" / name)
    set_current_student(students, "s0")
    port = free_port()
    env = {**os.environ, "TANDEM_ADMIN_TOKEN": TOKEN, "TANDEM_KEEP_VERSIONS": str(keep),
           "TANDEM_WATCH_INTERVAL_S": "0", "TANDEM_AGREEMENT_BUDGET_S": "0", "TANDEM_LOG_LEVEL": "warning"}
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tandem", "serve", "--index", str(root), "--student",
                             str(students), "--port", str(port)], env=env, stdout=log, stderr=log,
                            start_new_session=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False) as client:
            deadline = time.monotonic() + 300
            while True:
                assert proc.poll() is None, (work / "serve.log").read_text()
                assert time.monotonic() < deadline, "not ready"
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)

            def searches() -> None:
                for q in ("how do plants make energy", "ocean tides", "coffee roasting", "chess openings"):
                    assert client.post("/search", json={"query": q, "top_k": 5}).status_code == 200

            searches()
            rss = [rss_mib(proc.pid)]
            for i in range(1, changes + 1):
                set_current_student(students, f"s{i}")
                reload = client.post("/admin/reload", headers={"Authorization": f"Bearer {TOKEN}"})
                assert reload.status_code == 200, reload.text
                searches()
                time.sleep(0.5)  # a swapped-out version closes on a thread of its own
                rss.append(rss_mib(proc.pid))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"keep_versions": keep, "changes": changes, "rss_mib": [round(r, 1) for r in rss],
            "growth_mib": round(rss[-1] - rss[0], 1), "student_int8_mib": round(
                (student / "model.int8.onnx").stat().st_size / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--keep-versions", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-rss-") as work:
        print(json.dumps(measure(args.bundle, args.student, args.changes, args.keep_versions, Path(work))))


if __name__ == "__main__":
    main()
