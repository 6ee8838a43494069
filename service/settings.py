"""Service configuration: CLI options and `TANDEM_*` environment variables, validated once at startup."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.encoders.precision import StudentPrecision
from models.errors import InputError
from models.search.filters import MAX_DEPTH, MAX_IN_VALUES, MAX_NODES, MAX_VALUES, FilterLimits

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
ENV_PREFIX = "TANDEM_"
MAX_BATCH_QUERIES = 1024  # the schema's hard bound on `queries`; TANDEM_MAX_BATCH_QUERIES is at most this
MAX_KEEP_VERSIONS = 8
MAX_PROCESSES = 64  # each kept version holds its whole index in memory
DEFAULT = "default"  # the collection `--index/--student` make, which POST /search answers
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class BodyLimits:
    """How large a request body's JSON may be in shape, checked on its bytes before it is parsed
    (service.http.body): how deep it nests and how many values it holds."""

    depth: int
    values: int


class CollectionSpec(BaseModel):
    """One collection: its name (in URLs), its bundle (or bundle root) and its student."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Lowercase letters, digits, _ and -; at most 64 characters.")
    index: Path
    student: Path

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"collection name {value!r}: 1 to 64 lowercase letters, digits, _ or - "
                             "(starting with a letter or digit)")
        return value


def check_unique(specs: list[CollectionSpec] | tuple[CollectionSpec, ...]) -> None:
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"collection {dup!r} is declared twice")


# TANDEM_MAX_FILTER_CONDITIONS is at most this: a condition binds at most 10 parameters in the docstore's SQL
# (models.search.filters), so a filter stays under SQLite's default SQLITE_MAX_VARIABLE_NUMBER (32,766)
MAX_FILTER_CONDITIONS = 3000
# TANDEM_MAX_RESCORE_ROWS by default: offset 9,000 + top_k 1,000 at the ×16 a flat binary index of 1M documents
# rescores (160,000 rows) passes, the same at ×64 (10M documents: 640,000) is refused
MAX_RESCORE_ROWS = 262_144
MAX_FILTER_DEPTH = 64  # TANDEM_MAX_FILTER_DEPTH is at most this: a body's JSON nesting stays far below any parser's


class ServiceSettings(BaseSettings):
    """Everything `tandem serve` needs; bad values fail at startup with the variable named."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    index: Path = Field(description="Index bundle directory, or a bundle root whose CURRENT pointer is served.")
    student: Path = Field(description="Student directory (student.json, ONNX models, tokenizer).")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    student_precision: StudentPrecision = "int8"
    encode_threads: int = Field(1, ge=1, description="onnxruntime intra-op threads per worker.")
    search_threads: int = Field(1, ge=1, description="FAISS OpenMP threads per worker, and numpy's BLAS threads "
                                "per process (1 avoids oversubscription).")
    workers: int = Field(2, ge=0, description="Threads that encode and search batches (about one per core), "
                         "per process; 0: the event loop runs them itself, no hand-off (the cheapest per query "
                         "with one process per core, TANDEM_PROCESSES), while a batch then holds that process's "
                         "other requests.")
    processes: int = Field(1, ge=1, le=MAX_PROCESSES, description="Server processes sharing the port, each loading "
                           "the bundle and student (1: one process, no supervisor). Threads are per process: "
                           "set TANDEM_WORKERS to about cores / processes, or 0.")
    batch_max_queries: int = Field(
        1, ge=1, description="Most queries encoded together in one ONNX call, from concurrent requests or one "
        "batch request (1: each alone). The int8 student scales activations per call, so batchmates move a "
        "vector slightly (cosine ≥ 0.99).",
    )
    query_cache: int = Field(1024, ge=0, description="Query vectors kept for repeated queries, per process (LRU, "
                             "keyed by the student and the query as its tokenizer normalizes it; about 3 KB each at "
                             "768-d); 0: no cache, every query is encoded.")
    gil_switch_ms: float = Field(1.0, gt=0, le=1000, description="How long a thread may hold the GIL while another "
                                 "waits for it (sys.setswitchinterval; Python's default is 5): the event loop and the "
                                 "batch workers of a process share one GIL.")
    batch_wait_ms: float = Field(2.0, ge=0, description="Longest a batch waits for company while others are pending.")
    max_pending: int = Field(64, ge=1, description="Queries queued or running before new requests get 429.")
    max_queue_ms: float = Field(
        40.0, gt=0, description="While every worker is busy, a request whose estimated queue wait (from the "
        "measured pace) exceeds this gets 429: it bounds the latency of accepted requests under overload.",
    )
    request_timeout_ms: float = Field(1000.0, gt=0, description="Deadline of one request, queueing included (503).")
    max_batch_queries: int = Field(64, ge=1, le=MAX_BATCH_QUERIES,
                                   description="Most queries in one batch request ({'queries': [...]}).")
    max_total_hits: int = Field(
        10_000, ge=1, description="Most hits in one answer (queries × top_k): bounds the work and the body size.",
    )
    max_query_chars: int = Field(2048, ge=1)
    max_query_terms: int = Field(128, ge=1, description="Most distinct stems a lexical or hybrid query may hold "
                                 "(each is scored over its postings in every segment); beyond, 422.")
    max_filter_depth: int = Field(MAX_DEPTH, ge=1, le=MAX_FILTER_DEPTH, description="Most levels of and/or/not in a "
                                  "filter; a body's JSON may nest at most 2 × this + 8 levels (422 beyond, before "
                                  "it is parsed).")
    max_filter_conditions: int = Field(MAX_NODES, ge=1, le=MAX_FILTER_CONDITIONS,
                                       description="Most conditions and combinators in a filter.")
    max_in_values: int = Field(MAX_IN_VALUES, ge=1, description="Most values in one `in` list of a filter.")
    max_filter_values: int = Field(MAX_VALUES, ge=1, description="Most values in a whole filter (each eq counts one, "
                                   "each in its list's length).")
    max_top_k: int = Field(1000, ge=1)
    default_top_k: int = Field(10, ge=1)
    binary_oversample: int = Field(4, ge=1, description="Hamming candidates per hit before int8 rescoring.")
    max_rescore_rows: int = Field(
        MAX_RESCORE_ROWS, ge=1, description="Most stored vectors one request's binary rescoring may decode: queries × "
        "(offset + top_k) × the oversample (binary_oversample, or the index's own when deeper), per segment, at most "
        "each segment's rows; beyond, 422. Bounds the work and the candidate arrays; the decoding itself runs in "
        "chunks of 4 MiB of float32 (docs/operations.md#filters-and-memory-per-request).")
    log_level: LogLevel = "info"
    log_format: Literal["json", "text"] = Field("json", description="json: one object per line; text: plain.")
    api_keys: SecretStr | None = Field(None, description="Comma-separated API keys; any of them opens /search.")
    api_keys_file: Path | None = Field(None, description="API keys, one per line, '#' comments.")
    keys_file: Path | None = Field(None, description="Scoped API keys (TOML, one [[key]] table per key: its "
                                   "collections, a filter ANDed into its searches, /v1/embeddings or not); reloaded "
                                   "on SIGHUP and when the file changes.")
    collections: tuple[CollectionSpec, ...] = Field(
        (), description="Named collections (--collection NAME=INDEX,STUDENT, or --config FILE); empty: one "
        "collection, 'default', of TANDEM_INDEX and TANDEM_STUDENT.")
    collections_config: Path | None = Field(None, description="The --config file `collections` came from (with "
                                            "those of --collection): re-read on SIGHUP and when it changes, adding "
                                            "and removing its collections (service.core.collections_reload).")
    config_collections: tuple[str, ...] = Field(
        (), description="Set by `tandem serve`, not an option: the collections the --config file declared at "
        "startup (the others, from --collection and --index/--student, are not the file's to remove).")
    max_body_bytes: int = Field(1 << 20, ge=1, description="Largest request body; beyond it, 413.")
    cors_origins: str | None = Field(None, description="Comma-separated origins allowed by CORS; unset, CORS is off.")
    admin_token: SecretStr | None = Field(
        None, description="Bearer token of the /admin routes; unset, they are disabled (never open by default).",
    )
    metrics_token: SecretStr | None = Field(
        None, description="Bearer token that lets GET /metrics and GET /readyz name the collections (their labels, "
        "which failed and why); without it they name none (a key learns no collection it was not given).",
    )
    metrics_names: bool = Field(
        False, description="Let GET /metrics and GET /readyz name the collections to anyone who reaches them, no "
        "token needed (where the network already restricts them); off, only TANDEM_METRICS_TOKEN does.",
    )
    watch_interval_s: float = Field(
        2.0, ge=0, description="How often a bundle root's CURRENT pointer is polled for a new version (0: never).",
    )
    agreement_budget_s: float = Field(
        120.0, ge=0, description="After each load and reload, how long a background thread may spend scoring the "
        "student's agreement with the teacher on the segments not scored yet (service.core.agreement); 0: never.",
    )
    keep_versions: int = Field(2, ge=0, le=MAX_KEEP_VERSIONS, description="Previous versions kept loaded for "
                               "POST /admin/rollback; each holds its index in memory.")
    bundle_dirs: str | None = Field(
        None, description="Directories POST /admin/reload may load bundles from (separated by ':'); unset, the "
        "served bundle root (or the served bundle's parent directory).",
    )
    header_timeout_s: float = Field(10.0, gt=0, description="Longest a client may take to send a request's headers.")
    body_timeout_s: float = Field(30.0, gt=0, description="Longest a client may take to send a request's body.")
    keep_alive_s: float = Field(5.0, gt=0, description="Idle time before a keep-alive connection is closed.")
    shutdown_grace_s: float = Field(
        1.0, gt=0, le=60, description="On shutdown, how long a connection with no request in flight may still send "
        "one (answered, then closed) before it is closed.",
    )
    max_connections: int = Field(
        1000, ge=1, description="Connections and requests in progress; beyond it the server answers 503 at once.",
    )
    reload_wait_s: float = Field(
        60.0, gt=0, description="How long POST /admin/reload waits for the outcome before answering 202.",
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InputError(f"invalid service settings: {_describe(exc)}") from exc

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("admin_token", "metrics_token", mode="before")
    @classmethod
    def _blank_token_disables(cls, value: object) -> object:
        # An empty TANDEM_ADMIN_TOKEN= (or TANDEM_METRICS_TOKEN=) means "no token", never "any token opens it".
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _limits_consistent(self) -> ServiceSettings:
        if self.default_top_k > self.max_top_k:
            raise ValueError(f"default_top_k ({self.default_top_k}) exceeds max_top_k ({self.max_top_k})")
        if self.default_top_k > self.max_total_hits:
            raise ValueError(f"default_top_k ({self.default_top_k}) exceeds max_total_hits ({self.max_total_hits})")
        if self.max_batch_queries > self.max_pending:
            raise ValueError(f"TANDEM_MAX_BATCH_QUERIES ({self.max_batch_queries}) exceeds TANDEM_MAX_PENDING "
                             f"({self.max_pending}): such a batch could never be admitted")
        check_unique(self.collections)
        return self

    def collection_specs(self) -> list[CollectionSpec]:
        """The collections served: those declared, or 'default' of `index` and `student`."""
        return list(self.collections) or [CollectionSpec(name=DEFAULT, index=self.index, student=self.student)]

    def default_collection(self) -> str | None:
        """What POST /search, GET /index and /admin/reload act on: 'default', or the only collection; else None."""
        names = [spec.name for spec in self.collection_specs()]
        return DEFAULT if DEFAULT in names else names[0] if len(names) == 1 else None

    @property
    def filter_limits(self) -> FilterLimits:
        return FilterLimits(depth=self.max_filter_depth, nodes=self.max_filter_conditions,
                            in_values=self.max_in_values, values=self.max_filter_values)

    @property
    def max_json_depth(self) -> int:
        """How deep a request body's JSON may nest: enough for the deepest filter allowed (an and/or level is an
        object and a list), checked on the bytes before any parser recurses into them."""
        return 2 * self.max_filter_depth + 8

    @property
    def max_json_values(self) -> int:
        """How many values a request body's JSON may hold: twice the largest request allowed (a full batch of
        queries and a filter at its caps, each condition an object, a field and a value), checked on the bytes
        before they are parsed: json.loads and pydantic hold the GIL for each value, whichever thread runs them."""
        return 2 * (self.max_batch_queries + self.max_filter_values + 3 * self.max_filter_conditions) + 64

    @property
    def body_limits(self) -> BodyLimits:
        return BodyLimits(depth=self.max_json_depth, values=self.max_json_values)

    def oversubscribed(self, cores: int) -> str | None:
        """A warning when the threads that encode, over all processes, outnumber `cores`; None otherwise. Each
        process encodes on `workers` threads (its event loop when 0), each with `encode_threads` ONNX threads:
        past the cores they take turns, which costs throughput and latency (docs/operations.md)."""
        encoding = max(self.workers, 1)  # the event loop encodes when workers is 0
        lanes = self.processes * encoding * self.encode_threads
        if lanes <= cores:
            return None
        return (f"{self.processes} process(es) × {encoding} encoding thread(s) × {self.encode_threads} "
                f"ONNX thread(s) = {lanes} on {cores} core(s): set TANDEM_WORKERS (0: the event loop encodes) and "
                "TANDEM_ENCODE_THREADS so that the product is at most the cores")


def available_cores() -> int:
    """The cores this process may run on (its affinity, as a container's cpuset sets it): what
    `ServiceSettings.oversubscribed` is judged against, and what the benchmarks' bare limit spreads over."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _describe(exc: ValidationError) -> str:
    """One line per problem, naming the environment variable an operator would set."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        field = str(err["loc"][0]) if err["loc"] else ""
        name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
        parts.append(f"{name}: {err['msg']}")
    return "; ".join(parts)
