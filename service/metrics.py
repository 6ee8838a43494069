"""Prometheus metrics of one app, in a registry of its own (tests run several apps in one process).

`create_app` puts a `Metrics` on `app.state.metrics`; other modules call its methods:

- `metrics.observe_reload(outcome)`: count a hot reload by outcome ("success", "failed", "rolled_back", ...).
- `metrics.set_index(version, count, load_seconds)`: the bundle now in service.
- `metrics.observe_stage(stage, seconds)`: one stage's latency (see STAGES); service.core.loader wires it into
  each searcher it loads, as the student's tokenize and the index's rescore timer.
- `metrics.observe_query_cache(hits, misses)`: one lookup of the query-vector cache (service.core.query_cache).

`GET /metrics` (service.http.routes.metrics) renders the registry in the Prometheus text format, and sets the
index gauges from the loader. Requests are counted by service.http.middleware, the queue depth is read from the
searcher in service at scrape time.

With `--processes N` the parent sets PROMETHEUS_MULTIPROC_DIR (a fresh private directory) before it
starts the workers, so prometheus-client writes every value to memory-mapped files there and a scrape,
which lands on one process, renders them all through a MultiProcessCollector: counters and histograms
are summed over the processes (those that exited included, so totals never drop), gauges per their
`multiprocess_mode`: the queue depth is the live processes' sum, `tandem_index_info{version}` the number of
live processes serving that version (1 with one process), the documents and load time the live maximum.
A callback gauge cannot cross processes, so there each process writes its queue depth after every request.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

# tokenize ⊂ encode (student call); rescore ⊂ search (binary bundles); filter: a filter turned into rows;
# total: the whole HTTP request.
STAGES = ("queue", "tokenize", "encode", "search", "lexical", "filter", "rescore", "total")
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client reads it when first imported
# labels a scrape without TANDEM_METRICS_TOKEN never sees (`Unnamed`): collection names, and the segment (version)
# names of each collection
HIDDEN_LABELS = ("collection", "segment")
LOWEST = frozenset({"tandem_segment_agreement"})  # aggregated by the minimum, not the sum
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Scored(Protocol):
    """A segment's agreement (models.agreement.SegmentAgreement)."""

    segment: str
    overlap: float | None
    below: bool | None


class Metrics:
    """The service's metrics; cheap to update from any thread (prometheus-client locks internally)."""

    def __init__(self, queue_depth: Callable[[], float] | None = None) -> None:
        self.multiprocess_dir = os.environ.get(MULTIPROC_DIR) or None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.stage_seconds = Histogram(
            "tandem_stage_duration_seconds", "Latency of one serving stage (tokenize ⊂ encode, rescore ⊂ search).",
            ["stage"], buckets=_BUCKETS, registry=r,
        )
        self._stages = {stage: self.stage_seconds.labels(stage) for stage in STAGES}
        self.requests = Counter(
            "tandem_http_requests", "HTTP requests by route template, method and status.",
            ["route", "method", "status"], registry=r,
        )
        self.batch_queries = Histogram(
            "tandem_batch_queries",
            "Queries in a request's micro-batch, its own included (encoded TANDEM_BATCH_MAX_QUERIES per ONNX call).",
            buckets=(1, 2, 4, 8, 16, 32, 64), registry=r,
        )
        self.query_cache = Counter("tandem_query_cache", "Dense queries looked up in the query-vector cache "
                                   "(TANDEM_QUERY_CACHE), by result: hit (no encode) or miss.", ["result"], registry=r)
        self._cache_hit, self._cache_miss = self.query_cache.labels("hit"), self.query_cache.labels("miss")
        self.overloaded = Counter("tandem_overloaded", "Requests refused with 429 (admission control).", registry=r)
        self.queue_depth = Gauge("tandem_queue_depth", "Queries queued or running in the micro-batcher.", registry=r,
                                 multiprocess_mode="livesum")
        self._queue_depth = queue_depth
        if queue_depth is not None and self.multiprocess_dir is None:
            self.queue_depth.set_function(queue_depth)
        self.index_info = Gauge("tandem_index_info", "The bundle version in service (value 1; with several "
                                "processes, how many serve it).", ["version"], registry=r, multiprocess_mode="livesum")
        self.index_documents = Gauge("tandem_index_documents", "Documents in the bundle in service.", registry=r,
                                     multiprocess_mode="livemax")
        self.index_load_seconds = Gauge("tandem_index_load_seconds", "How long the bundle in service took to load.",
                                        registry=r, multiprocess_mode="livemax")
        self._version: str | None = None
        self.reloads = Counter("tandem_reloads", "Hot reloads by outcome.", ["outcome"], registry=r)
        # per collection (service.core.collections): the default one is also what the unlabelled metrics report
        self.collection_reloads = Counter("tandem_collection_reloads", "Hot reloads by collection and outcome.",
                                          ["collection", "outcome"], registry=r)
        self.collection_searches = Counter("tandem_collection_searches", "Search requests by collection (those "
                                           "that reached one: a 404 counts nowhere).", ["collection"], registry=r)
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self.collection_ready = Gauge("tandem_collection_ready", "1 when the collection serves, 0 while it loads "
                                      "or after it failed to load.", ["collection"], registry=r,
                                      multiprocess_mode="livemin")
        self.collection_documents = Gauge("tandem_collection_documents", "Documents in the collection's version "
                                          "in service.", ["collection"], registry=r, multiprocess_mode="livemax")
        self.segment_agreement = Gauge(
            "tandem_segment_agreement", "The student's top-10 overlap with the teacher on a segment's agreement "
            "sample (segment \"version\": the version's; service.core.agreement).", ["collection", "segment"],
            registry=r, multiprocess_mode="livemax")
        self.segment_agreement_below = Gauge(
            "tandem_segment_agreement_below", "1 when the segment's overlap is below the threshold relative to the "
            "student's home segments, else 0.", ["collection", "segment"], registry=r, multiprocess_mode="livemax")
        # when the initial load began, and whether the index gauges are set (service.http.routes.metrics reads the
        # loader into them; set_index marks them set)
        self.load_started: float | None = None
        self.index_set = False

    def observe_stage(self, stage: str, seconds: float) -> None:
        hist = self._stages.get(stage)
        if hist is not None:
            hist.observe(seconds)

    def observe_query_cache(self, hits: int, misses: int) -> None:
        """One lookup of the query-vector cache (service.core.query_cache): how many texts it held and lacked."""
        if hits:
            self._cache_hit.inc(hits)
        if misses:
            self._cache_miss.inc(misses)

    def observe_timing_ms(self, timing_ms: Mapping[str, float]) -> None:
        """A request's per-stage timings as the batcher reports them (milliseconds)."""
        for stage, ms in timing_ms.items():
            self.observe_stage(stage, ms / 1e3)

    def observe_request(self, route: str, method: str, status: int) -> None:
        # each (route, method, status) child is looked up once: `labels` validates and locks on every call, and
        # routes, methods and statuses are few (middleware bounds the route to a template or "unmatched")
        child = self._request_children.get((route, method, status))
        if child is None:
            child = self.requests.labels(route, method, str(status))
            self._request_children[(route, method, status)] = child
        child.inc()
        if status == 429:
            self.overloaded.inc()
        self.sync_queue_depth()

    def sync_queue_depth(self) -> None:
        """With several processes, write this one's queue depth to its file (after each request, and at a scrape)."""
        if self.multiprocess_dir is not None and self._queue_depth is not None:
            self.queue_depth.set(self._queue_depth())

    def observe_reload(self, outcome: str) -> None:
        self.reloads.labels(outcome).inc()

    def set_index(self, version: str, count: int, load_seconds: float) -> None:
        self.index_set = True
        if self.multiprocess_dir is None:
            self.index_info.clear()  # only the version in service is reported
        elif self._version is not None and self._version != version:
            self.index_info.labels(self._version).set(0)  # files cannot drop a label: this process left it
        self._version = version
        self.index_info.labels(version).set(1)
        self.index_documents.set(count)
        self.index_load_seconds.set(load_seconds)

    def set_agreement(self, collection: str, scores: Sequence[Scored], gone: Sequence[str]) -> None:
        """A collection's agreement per segment (service.core.agreement); `gone`: segments no longer in service."""
        for segment in gone:
            for gauge in (self.segment_agreement, self.segment_agreement_below):
                with contextlib.suppress(KeyError):
                    gauge.remove(collection, segment)
        for score in scores:
            if score.overlap is not None:
                self.segment_agreement.labels(collection, score.segment).set(score.overlap)
            if score.below is not None:
                self.segment_agreement_below.labels(collection, score.segment).set(int(score.below))

    def render(self, names: bool = False) -> bytes:
        """The text format; without `names`, the per-collection series summed over the collections (`Unnamed`)."""
        source: CollectorRegistry = self.registry
        if self.multiprocess_dir is not None:
            self.sync_queue_depth()
            source = CollectorRegistry()
            MultiProcessCollector(source, path=self.multiprocess_dir)
        return generate_latest(source if names else Unnamed(source))


class Unnamed:
    """A registry's metrics with the `collection` and `segment` labels aggregated away, for a scrape that may not
    learn the collections' names (service.http.scoping.may_name_collections): the counters are summed (searches,
    reloads by outcome over every collection), as are tandem_collection_ready (how many collections serve),
    tandem_collection_documents (documents served in all) and tandem_segment_agreement_below (how many segments
    are below the threshold); tandem_segment_agreement is the lowest overlap of any segment. A `_created` sample
    keeps the earliest time."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            if not any(label in sample.labels for sample in family.samples for label in HIDDEN_LABELS):
                yield family
                continue
            groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
            for sample in family.samples:
                kept = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in HIDDEN_LABELS))
                groups.setdefault((sample.name, kept), []).append(sample.value)
            merged = Metric(family.name, f"{family.documentation} Over every collection: their names need "
                            "TANDEM_METRICS_TOKEN.", family.type, family.unit)
            for (name, labels), values in groups.items():
                lowest = name.endswith("_created") or family.name in LOWEST
                merged.add_sample(name, dict(labels), min(values) if lowest else sum(values))
            yield merged
