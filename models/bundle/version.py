"""Opening an index bundle (a version): its segments, their tombstones and the space they share, checked.

A version is an ordered list of immutable segments (models.bundle.manifest.SegmentInfo): the first is the bundle's own
top level (all there is in a fresh build and in bundles made before segments), later ones live under
`segments/NAME/`, each with its own first stage, rescore codes, docstore and lexical postings. Rows a later
change replaced or deleted are tombstones: `tombstones/NAME.npy`, per segment, as of this version. What makes
scores comparable across segments (the rotation, the int8 calibration, the binary center and spin) is the
version's, fixed by its first segment, at its top level.

Rows are numbered across the whole version: segment i's rows follow segment i-1's (deleted ones included), so a
row names one document of one version. A loaded `Segment` is shared by every loaded version that lists it
(`Bundle(..., reuse=...)`): a hot reload to a version that adds one segment loads only that one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from models.bundle.legacy import open_lexical, segment_payload, whole_bm25s
from models.bundle.lexical.postings import LEXICAL_DIR, Bm25sIndex, Lexical, LexicalPart, PostingsIndex
from models.bundle.manifest import BUNDLE_MANIFEST, TOMBSTONES_DIRECTORY, BundleManifest, FusionSpec, SegmentInfo
from models.bundle.payload.index import PayloadIndex
from models.bundle.payload.writer import payload_files
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.bundle.storage.integrity import Verification, Verified, load_checked_array, verify_files
from models.bundle.storage.rows import Allowed, row_mask
from models.bundle.vectors.index import INDEX_FILE, RESCORE_FILE, ROW_CODES_FILE, VectorIndex
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.space import SPACE_FILES, Space
from models.contract import TeacherRef, check_same_teacher
from models.errors import ContractMismatch
from models.manifest_io import read_manifest

log = logging.getLogger(__name__)

class NoLexicalIndex(ValueError):
    """Lexical or hybrid search asked of a bundle without a lexical index."""


def read_bundle_manifest(directory: Path) -> BundleManifest:
    return read_manifest(Path(directory) / BUNDLE_MANIFEST, BundleManifest, "index bundle")


def _prefix(segment: SegmentInfo) -> str:
    """What a segment's file names begin with in the version's manifest."""
    return "" if segment.path == "." else f"{segment.path}/"


def in_segment(segment: SegmentInfo, name: str) -> str:
    """A segment's file `name` as the version's manifest names it."""
    return _prefix(segment) + name


def _segment_names(manifest: BundleManifest, segment: SegmentInfo) -> Iterator[tuple[str, str]]:
    """Each file of a segment the manifest lists: (its name within the segment, its name in the version)."""
    cut = len(_prefix(segment))
    return ((name[cut:], name) for name in manifest.segment_files(segment))


def tombstones_name(segment: SegmentInfo) -> str:
    return f"{TOMBSTONES_DIRECTORY}/{segment.name}.npy"


def required_files(manifest: BundleManifest) -> list[str]:
    """Every file the loader reads for this manifest: each must be listed (and so checksummed) in `files`."""
    names = Space.files(manifest)
    for segment in manifest.parts:
        names += [in_segment(segment, INDEX_FILE), in_segment(segment, DOCSTORE_FILE)]
        if manifest.quantization is Quantization.BINARY:
            names.append(in_segment(segment, RESCORE_FILE))
        if segment.tombstones is not None:
            names.append(segment.tombstones)
        payload = segment_payload(manifest, segment)
        if payload is not None:
            names += [in_segment(segment, name) for name in payload_files(payload)]
    return names


def _present_files(directory: Path, manifest: BundleManifest) -> list[str]:
    """The optional files on disk that the loader reads (the segments' lexical indexes, an IVF's codes by row):
    each must be listed, or it would never be checksummed."""
    names = []
    for segment in manifest.parts:
        if (directory / segment.path / ROW_CODES_FILE).is_file():
            names.append(in_segment(segment, ROW_CODES_FILE))
        lexical = directory / segment.path / LEXICAL_DIR
        if segment.lexical is not None and lexical.is_dir():
            names += sorted(in_segment(segment, f"{LEXICAL_DIR}/{p.name}") for p in lexical.iterdir())
    return names


def _check_listed(directory: Path, manifest: BundleManifest) -> None:
    unlisted = [name for name in required_files(manifest) + _present_files(directory, manifest)
                if name not in manifest.files]
    if unlisted:
        raise ContractMismatch(f"{directory}: the manifest does not list {', '.join(unlisted)}, which the loader "
                               "reads; an unlisted file is never checksummed")
    names = [s.name for s in manifest.parts]
    if len(set(names)) != len(names) or manifest.parts[0].path != "." or any(s.path == "." for s in manifest.parts[1:]):
        raise ContractMismatch(f"{directory}: the manifest's segments must have distinct names, the first at the "
                               "version's top level ('.') and no other")
    if sum(s.live for s in manifest.parts) != manifest.count:
        raise ContractMismatch(f"{directory}: the segments hold {sum(s.live for s in manifest.parts)} live documents, "
                               f"the manifest says {manifest.count}")
    check_own_directories(directory, manifest)
    for name in manifest.files:
        path = directory / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ContractMismatch(f"{directory}: {name} is not a regular file of the bundle")


def check_own_directories(directory: Path, manifest: BundleManifest) -> None:
    """Every directory the manifest's files lie in (lexical/, payload/, segments/NAME/, tombstones/) is the
    version's own: a symbolic link to a directory elsewhere would have the loader read, and a writer hard-link,
    files from outside the version."""
    inside = {"/".join(parts[:i]) for parts in (n.split("/") for n in manifest.files) for i in range(1, len(parts))}
    for name in sorted(inside):
        if (directory / name).is_symlink():
            raise ContractMismatch(f"{directory}: {name}/ is a symbolic link; a version's directories must be its "
                                   "own (copy the directory in, or publish the version again)")


def reread_files(manifest: BundleManifest) -> list[str]:
    """The files every version reads again, however many segments it shares with the one in service: the space
    files and the tombstones. Never trusted by their identity."""
    names = [name for name in SPACE_FILES if name in manifest.files]
    return names + [s.tombstones for s in manifest.parts if s.tombstones is not None]


def verify_version(directory: Path, manifest: BundleManifest, trusted: Verified | None = None) -> Verification:
    """Check every file `manifest` (read once, by the caller) lists against its sha256; raise naming the first bad
    one. The manifest must list every file the loader reads, each a regular file inside the bundle (no link out).

    `trusted` is what the version in service verified: a file it hashed, still with the same device, inode, size
    and mtime_ns and the same sha256 in this manifest (a segment hard-linked into the next version), is not read
    again; the space files and tombstones always are (models.bundle.storage.integrity says why, and the limit).
    """
    directory = Path(directory)
    _check_listed(directory, manifest)
    return verify_files(directory, manifest.files, trusted, always=reread_files(manifest))


def verify_bundle(directory: Path) -> BundleManifest:
    """Read the manifest and check every file it lists (none trusted); `tandem index verify`'s first step."""
    manifest = read_bundle_manifest(directory)
    verify_version(directory, manifest)
    return manifest


def segment_key(manifest: BundleManifest, segment: SegmentInfo) -> str:
    """What a loaded segment is, whatever version lists it: its name, the sha256 of its files and of the space
    they are scored in. Two versions that give a segment the same key can share one loaded copy."""
    files = {within: manifest.files[name] for within, name in _segment_names(manifest, segment)}
    space = {name: manifest.files.get(name) for name in SPACE_FILES}
    payload = {"name": segment.name, "files": files, "space": space, "dim": manifest.dim,
               "quantization": manifest.quantization.value, "index": segment.index.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class Segment:
    """One loaded segment: its first stage, rescore codes, docstore and lexical index. Shared by the versions
    that list it; `release` by the last one closes it."""

    def __init__(self, version: Path, manifest: BundleManifest, info: SegmentInfo, key: str, lexical: bool,
                 space: Space, mapped: bool = False) -> None:
        self.info, self.key, self.with_lexical = info, key, lexical
        self.directory = version if info.path == "." else version / info.path
        self._lock = threading.Lock()
        self._users = 1
        try:
            self.vectors = VectorIndex.load(self.directory, manifest.dim, manifest.quantization, info.index, space,
                                            mapped)
        except ValueError as exc:  # ours: says what does not match
            raise ContractMismatch(f"{self.directory}: unreadable index files: {exc}") from exc
        except (RuntimeError, OSError) as exc:
            # FAISS's or the OS's text (source paths, internals) goes to the log, not into the error.
            log.error("%s: unreadable index files: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable index files ({type(exc).__name__})") from exc
        if self.vectors.count != info.count:
            raise ContractMismatch(f"{self.directory}: index holds {self.vectors.count} vectors, manifest says "
                                   f"{info.count}")
        self.docs = DocStore(self.directory / DOCSTORE_FILE)
        try:
            rows = self.docs.count()
        except sqlite3.DatabaseError as exc:
            self.docs.close()
            log.error("%s: unreadable docstore: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable {DOCSTORE_FILE} ({type(exc).__name__})") from exc
        if rows != info.count:
            self.docs.close()
            raise ContractMismatch(f"{self.directory}: {DOCSTORE_FILE} holds {rows} documents, manifest says "
                                   f"{info.count}")
        try:
            self.lexical = open_lexical(self.directory, info) if lexical else None
        except (ValueError, OSError, KeyError) as exc:
            self.docs.close()
            log.error("%s: unreadable lexical index: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable lexical index ({type(exc).__name__})") from exc
        payload = segment_payload(manifest, info)
        try:  # its files opened: each field is mapped when a filter first names it
            self.payload = None if payload is None else PayloadIndex(self.directory, payload, info.count)
        except (ValueError, OSError) as exc:
            self.docs.close()
            log.error("%s: unreadable payload index: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable payload index ({type(exc).__name__})") from exc

    @property
    def count(self) -> int:
        return self.info.count

    def acquire(self) -> bool:
        """Take one more user; False once the segment is closed (its last user released it)."""
        with self._lock:
            if self._users == 0:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        # The memory maps of its lexical and payload indexes, and the payload parts not mapped yet, hold a descriptor
        # each: let them go now, not whenever the garbage collector gets to a retired version (issue 42: a
        # follower's versions retired faster than collected held 956 descriptors).
        if last:
            self.docs.close()
            if self.payload is not None:
                self.payload.close()
            self.lexical = self.payload = None


def _tombstones(directory: Path, info: SegmentInfo, files: Mapping[str, str]) -> np.ndarray | None:
    """The mask of the segment's deleted rows (None when it has none), checked against the manifest (its sha256
    over the very bytes loaded, and its rows)."""
    if info.tombstones is None:
        if info.deleted:
            raise ContractMismatch(f"{directory}: segment {info.name} has {info.deleted} deleted rows but no "
                                   "tombstones file")
        return None
    try:
        rows = load_checked_array(directory, info.tombstones, files)
    except (OSError, ValueError) as exc:
        raise ContractMismatch(f"{directory / info.tombstones}: unreadable tombstones ({type(exc).__name__})") from exc
    if rows.ndim != 1 or len(rows) != info.deleted or (len(rows) and (
            rows.dtype.kind not in "iu" or rows[0] < 0 or rows[-1] >= info.count or np.any(np.diff(rows) <= 0))):
        raise ContractMismatch(f"{directory / info.tombstones}: expected {info.deleted} distinct ascending rows of "
                               f"segment {info.name} (0 to {info.count - 1})")
    return row_mask(rows, info.count) if len(rows) else None


def tombstone_masks(directory: Path, manifest: BundleManifest) -> list[np.ndarray]:
    """Each segment's mask of deleted rows as of `manifest` (all False where it has none), checked."""
    return [np.zeros(s.count, dtype=bool) if (m := _tombstones(directory, s, manifest.files)) is None else m
            for s in manifest.parts]


class Bundle:
    """A loaded, read-only version: its segments with their tombstones, checked against the manifest;
    models.search searches it."""

    def __init__(self, directory: Path, lexical: bool = True, reuse: Bundle | None = None,
                 manifest: BundleManifest | None = None, verified: Verified | None = None,
                 mapped: bool = False, only: Sequence[int] | None = None) -> None:
        """Load the version; `lexical=False` skips the lexical indexes; segments that `reuse` (a loaded version)
        already holds are shared with it, not loaded again. `manifest` is the one the caller read (and verified
        the files against: `verified`, which the next reload may trust), else it is read here. `mapped`: the
        segments' first stages are memory-mapped, not read into RAM (VectorIndex.load). `only`: the positions of
        the segments to load, ascending (a shard of the version, models.search.shards): rows keep their numbers
        across the whole version, and `count`, the lexical statistics and the docstores are those segments' alone."""
        self.directory = Path(directory).resolve()
        self.manifest = read_bundle_manifest(self.directory) if manifest is None else manifest
        self.verified: Verified = dict(verified or {})
        _check_listed(self.directory, self.manifest)
        missing = [name for name in self.manifest.files if not (self.directory / name).is_file()]
        if missing:
            raise ContractMismatch(f"{self.directory}: bundle is incomplete, missing {', '.join(missing)}")
        try:  # once for the version: its segments share it
            self.space = Space.of(self.directory, self.manifest)
        except ValueError as exc:  # ours or numpy's: says which file does not match
            raise ContractMismatch(f"{self.directory}: unreadable space files: {exc}") from exc
        except OSError as exc:
            log.error("%s: unreadable space files: %s", self.directory, exc)
            raise ContractMismatch(f"{self.directory}: unreadable space files ({type(exc).__name__})") from exc
        parts = list(range(len(self.manifest.parts))) if only is None else list(only)
        if not parts or parts != sorted(set(parts)) or parts[0] < 0 or parts[-1] >= len(self.manifest.parts):
            raise ValueError(f"{self.directory}: segments {parts} are not distinct ascending positions of its "
                             f"{len(self.manifest.parts)} segments")
        self.parts = parts
        infos = [self.manifest.parts[i] for i in parts]
        self.segments: list[Segment] = []
        self.reused = 0
        try:
            for info in infos:
                key = segment_key(self.manifest, info)
                shared = reuse.shared(key, lexical) if reuse is not None else None
                self.segments.append(shared or Segment(self.directory, self.manifest, info, key, lexical, self.space,
                                                       mapped))
                self.reused += shared is not None
            self.deleted = [_tombstones(self.directory, info, self.manifest.files) for info in infos]
        except BaseException:
            self.close()
            raise
        every = np.cumsum([0] + [p.count for p in self.manifest.parts[:-1]]).astype(np.int64)
        self.bases = every[parts]  # where each loaded segment's rows start in the whole version
        # per segment, its live rows when some are deleted (the rows an unfiltered search may return), else None
        self.live = [None if d is None else Allowed(~d) for d in self.deleted]
        self.count = self.manifest.count if only is None else sum(info.live for info in infos)
        self.lexical = self._lexical() if lexical else None
        self.fusion = self.manifest.fusion or FusionSpec()
        log.info("bundle %s: %d docs in %d segments (%d shared with the version in service), %d-d %s %s",
                 self.directory, self.count, len(self.segments), self.reused, self.manifest.dim,
                 self.manifest.quantization.value, self.manifest.index.type.value)

    def _lexical(self) -> Lexical | Bm25sIndex | None:
        indexes = [s.lexical for s in self.segments]
        if any(i is None for i in indexes):
            return None
        whole = whole_bm25s(indexes)
        if whole is not None:
            return whole
        if not all(isinstance(i, PostingsIndex) for i in indexes):
            raise ContractMismatch(f"{self.directory}: a version of several segments needs postings in each (its "
                                   "first was built before segments): compact it with `tandem index compact`")
        info = self.manifest.lexical or self.manifest.parts[0].lexical
        assert info is not None
        parts = [LexicalPart(i, d) for i, d in zip(indexes, self.deleted, strict=True)]  # type: ignore[arg-type]
        return Lexical(info, parts)

    def shared(self, key: str, lexical: bool = True) -> Segment | None:
        """This version's segment with `key` (loaded with its lexical index or not, as asked), with one more user,
        for a version that lists it too."""
        for segment in self.segments:
            if segment.key == key and segment.with_lexical == lexical and segment.acquire():
                return segment
        return None

    @property
    def teacher(self) -> TeacherRef:
        return self.manifest.teacher

    def check_student(self, student_teacher: TeacherRef) -> None:
        check_same_teacher(student_teacher, self.teacher)
        if self.manifest.dim > student_teacher.dim:
            raise ContractMismatch(f"bundle dim {self.manifest.dim} exceeds the student's {student_teacher.dim}")

    @cached_property
    def filter_fields(self) -> frozenset[str]:
        """The fields a filter may name: the metadata keys present, and the declared fields (even if none holds a
        value). Read from the manifest, which a loaded version never changes: built once, not per request."""
        declared = [f.name for f in self.manifest.payload.fields] if self.manifest.payload is not None else []
        return frozenset([*self.manifest.metadata_fields, *declared])

    def require_lexical(self) -> Lexical | Bm25sIndex:
        """The lexical index, or NoLexicalIndex (a 422 in the service) for a bundle built without one."""
        if self.lexical is None:
            raise NoLexicalIndex(f"bundle {self.directory.name} has no lexical index (built before lexical "
                                 "search existed); rebuild it with `tandem index build` for mode lexical or hybrid")
        return self.lexical

    def live_rows(self) -> np.ndarray:
        """The version rows of the live documents, ascending."""
        return np.concatenate([np.arange(s.count, dtype=np.int64) + base if d is None else np.flatnonzero(~d) + base
                               for s, d, base in zip(self.segments, self.deleted, self.bases, strict=True)])

    def ids(self) -> list[str]:
        """The live documents' ids, in row order."""
        out: list[str] = []
        for segment, deleted in zip(self.segments, self.deleted, strict=True):
            ids = segment.docs.ids()
            out += ids if deleted is None else [i for i, gone in zip(ids, deleted, strict=True) if not gone]
        return out

    def close(self) -> None:
        """Let go of the segments: each closes once no loaded version uses it (and its memory maps with it)."""
        segments, self.segments = self.segments, []
        self.lexical = None  # its parts hold the segments' postings: the maps would outlive the segments
        for segment in segments:
            segment.release()
