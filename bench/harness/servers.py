"""What the bench scripts that drive a live HTTP server share: a free port, `tandem serve` as a subprocess,
waiting until a server answers (`served` does all three and stops it after), its memory, stopping it, and judging
a load step against a p99 bound.

Servers run as child processes on 127.0.0.1 with their output in a log file; each is stopped with SIGINT
(uvicorn's graceful shutdown) and killed only if it does not exit in time.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.record import REPO
from tandem.loadtest import LoadReport

log = logging.getLogger("bench.servers")

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_process(cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                  cwd: Path = REPO) -> subprocess.Popen[bytes]:
    """`cmd` in `cwd` (the repository root; another source tree's, to serve that tree's code: `python -m` puts
    the working directory first on sys.path), stdout and stderr into `log_path`, with `env` added to this
    environment."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as fh:
        return subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=cwd)


def tandem_serve_cmd(index: Path, student: Path, port: int) -> list[str]:
    """`tandem serve` with its default settings on 127.0.0.1:`port`."""
    return [sys.executable, "-m", "tandem", "serve", "--index", str(index), "--student", str(student),
            "--host", "127.0.0.1", "--port", str(port)]


def wait_ready(client: httpx.Client, server: subprocess.Popen[bytes], path: str = "/readyz",
               timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll GET `path` until it answers 200; fail early if the server exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} during startup")
        try:
            if client.get(path).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the server was not ready within {timeout_s:g} s")


@dataclass(frozen=True)
class Served:
    """A ready `tandem serve` child: its process, a client on its address, and its port."""

    process: subprocess.Popen[bytes]
    client: httpx.Client
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def served(index: Path, student: Path, log_path: Path, env: Mapping[str, str] | None = None, *, cwd: Path = REPO,
           timeout_s: float = 60.0, ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[Served]:
    """`tandem serve --index --student` on a free port of 127.0.0.1 (the code of the tree at `cwd`), with a client
    whose requests time out after `timeout_s`; yields once it is ready and stops it (SIGINT) on the way out."""
    port = free_port()
    process = start_process(tandem_serve_cmd(index, student, port), log_path, env, cwd)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s, trust_env=False) as client:
            wait_ready(client, process, timeout_s=ready_timeout_s)
            yield Served(process, client, port)
    finally:
        stop(process)


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants: the workers of `tandem serve --processes N` are children of the supervisor's
    forkserver, itself the supervisor's child (service.runtime.workers)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return [pid]
    return [pid, *(p for child in children for p in process_tree(child))]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, every thread, and of its live children (the workers of `--processes N`)."""
    total = 0
    for process in process_tree(pid):
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a worker that exited meanwhile
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total / CLOCK_TICKS


def rss_mib(pid: int, field: str = "VmHWM") -> float | None:
    """A memory field of /proc/PID/status in MiB: VmHWM (peak resident set so far) or VmRSS (now); None where
    unknown (the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def stop(server: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT (graceful shutdown), then SIGKILL after `timeout_s`."""
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not stop within %g s; killing it", server.pid, timeout_s)
        server.kill()
        server.wait()


@dataclass(frozen=True)
class Step:
    """One open-loop run at a fixed rate, judged: no error, enough of the rate answered, p99 within a bound."""

    report: LoadReport
    passed: bool
    why: str

    @property
    def rps(self) -> float:
        return self.report.target_rps

    def ms(self, name: str) -> float:
        """A latency percentile of the 2xx answers ("p50", "p99", ...); infinite when none came."""
        return self.report.latency_ms.get(name, float("inf"))


def judge(report: LoadReport, p99_bound_ms: float, min_fraction: float = 0.95) -> Step:
    why = []
    if report.failures:
        why.append(f"{report.failures} errors")
    if report.achieved_rps < min_fraction * report.target_rps:
        why.append(f"achieved {report.achieved_rps:.1f} < {min_fraction:.0%} of {report.target_rps:g} rps")
    p99 = report.latency_ms.get("p99", float("inf"))
    if p99 > p99_bound_ms:
        why.append(f"p99 {p99:.0f} ms > {p99_bound_ms:g} ms")
    return Step(report, not why, "; ".join(why) or "ok")


# --- nginx in front of several servers --------------------------------------------------------------------

UPSTREAM_HEADER = "X-Tandem-Upstream"


def nginx_binary() -> str:
    """Debian's nginx (`apt-get install nginx`): on PATH, or /usr/sbin (not on a non-root user's PATH)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None)
    if found is None:
        raise SystemExit("nginx is not installed: run `apt-get install -y nginx` (as root) and try again")
    return found


def nginx_config(work: Path, port: int, upstream_ports: Sequence[int]) -> str:
    """A self-contained nginx.conf balancing over `upstream_ports`, with every path inside `work`, so it
    needs no root and leaves the system's nginx alone. The proxy settings are those of docker/nginx.conf:
    only connection errors and timeouts move a request to the next replica (a 429 or 503 is passed on, so
    load shedding still reaches the client); each answer names its replica in X-Tandem-Upstream."""
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;" for p in upstream_ports)
    temp = "\n".join(f"    {name}_temp_path {work / 'tmp' / name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""daemon off;
worker_processes 1;
pid {work / 'nginx.pid'};
error_log {work / 'error.log'} warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log {work / 'access.log'};
{temp}
    upstream tandem {{
{servers}
        keepalive 32;
        keepalive_timeout 4s;  # below uvicorn's 5 s, so nginx never reuses a connection the server is closing
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://tandem;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_connect_timeout 2s;
            proxy_read_timeout 30s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 2;
            add_header {UPSTREAM_HEADER} $upstream_addr always;
        }}
    }}
}}
"""


def start_nginx(work: Path, port: int, upstream_ports: Sequence[int]) -> subprocess.Popen[bytes]:
    """nginx in the foreground on 127.0.0.1:`port` in front of `upstream_ports`; config and logs in `work`."""
    binary = nginx_binary()
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / "tmp" / name).mkdir(parents=True, exist_ok=True)
    conf = work / "nginx.conf"
    conf.write_text(nginx_config(work, port, upstream_ports))
    test = subprocess.run([binary, "-t", "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
                          capture_output=True, text=True)
    if test.returncode != 0:
        raise RuntimeError(f"nginx rejected {conf}: {test.stderr.strip()}")
    return start_process([binary, "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
                         work / "nginx.out")


def nginx_version() -> str:
    """`nginx/1.22.1`, as `nginx -v` prints it (on stderr)."""
    result = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True)
    return (result.stderr or result.stdout).strip().removeprefix("nginx version: ")
