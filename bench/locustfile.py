"""Locust scenario for teams that already use locust (`pip install locust`; not a tandem dependency).

    locust -f bench/locustfile.py --host http://127.0.0.1:8000 --headless -u 50 -r 10 -t 60s

Locust is closed-loop (each user waits for its answer), so a slow server also slows the load:
for latency budgets prefer `tandem loadtest`, which sends on a fixed schedule.
TANDEM_LOADTEST_QUERIES may name a BEIR queries JSONL or a file with one query per line.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from locust import HttpUser, between, task

from tandem.loadtest import read_queries

_path = os.environ.get("TANDEM_LOADTEST_QUERIES")
QUERIES = itertools.cycle(read_queries(Path(_path) if _path else None))


class SearchUser(HttpUser):
    wait_time = between(0.0, 0.1)

    @task(9)
    def search(self) -> None:
        self.client.post("/search", json={"query": next(QUERIES), "top_k": 10}, name="/search")

    @task(1)
    def batch_search(self) -> None:
        queries = [next(QUERIES) for _ in range(8)]
        self.client.post("/search", json={"queries": queries, "top_k": 10}, name="/search (batch of 8)")
