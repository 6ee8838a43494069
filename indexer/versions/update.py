"""`tandem index update`: a new version from a base version plus upserts and deletes, in one new segment.

The new version hard-links every file of its base and adds one segment holding the added and replaced
documents (only those go through the teacher) with tombstones for the rows they replace and the deleted ones
(indexer.versions.segments). Its time, memory and new disk space follow the number of changes, not the corpus: nothing
of the base is read but the rows the changes name, by id, in each segment's docstore.

A bundle built before segments is rewritten whole by its first update (indexer.versions.rewrite): its lexical index
cannot take another segment. Every later update is a segment; `tandem index compact` merges them back into one.
"""

from __future__ import annotations

import logging
import time

from indexer.publish import publish
from indexer.rootlock import writer_step
from indexer.sample import add_samples
from indexer.versions.changes import read_changes
from indexer.versions.next_version import finish, teacher_vectors
from indexer.versions.request import UpdateRequest, base_dir
from indexer.versions.rewrite import rewrite
from indexer.versions.segments import apply_changes, link_version
from indexer.writer import write_version_manifest
from models.bundle.legacy import takes_segments
from models.bundle.manifest import BundleManifest
from models.bundle.vectors.space import Space
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import new_version_name

log = logging.getLogger(__name__)


def update(req: UpdateRequest) -> BundleManifest:
    """Publish the base plus the changes. Into a root, under its writer lock from reading the base to moving
    CURRENT (indexer.rootlock): a concurrent writer's version is this one's base, or is made from this one."""
    req.check()
    with writer_step(req.root):
        return _update(req)


def _update(req: UpdateRequest) -> BundleManifest:
    started = time.perf_counter()
    source_dir = base_dir(req)
    base = read_bundle_manifest(source_dir)
    if not takes_segments(base):
        log.warning("%s was built before segments: this update rewrites it whole, once; later updates add segments",
                    source_dir)
        return rewrite(req, source_dir)
    # Change lines are parsed as the base corpus was: with --metadata-extra, a line's other keys stay metadata; and
    # the version's payload schema is kept, so a value of one of its fields must have the field's type.
    changes = read_changes(req.changes, req.delete_ids, extra_metadata=base.corpus.metadata_extra,
                           fields=base.payload_fields)
    card, store, run = req.teacher_for(base)
    with publish(req.target, what="update") as (staging, version):
        link_version(source_dir, base, staging)
        applied = apply_changes(staging, base, changes, name=version or new_version_name(),
                                space=Space.of(source_dir, base),
                                vectors=teacher_vectors(card, store, run))
        manifest = finish(applied.manifest, base, source_dir, version, started, applied.changed)
        if applied.segment is not None:
            manifest = add_samples(staging, manifest, [applied.segment.name], card, run.device,
                                   precision=run.precision or "fp32", batch_tokens=run.batch_tokens)
        write_version_manifest(staging, manifest)
    c = applied.counts
    log.info("update of %s: %d added, %d replaced, %d deleted, %d unchanged; encoded %d; published %s in %.1fs",
             source_dir, c["added"], c["replaced"], c["deleted"], c["unchanged"], applied.encoded,
             req.target.describe(version), time.perf_counter() - started)
    return manifest
