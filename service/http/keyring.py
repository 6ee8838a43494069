"""Which key opens what: every configured key as a sha256 digest with its scope, matched in constant time.

Two sources, one keyring: TANDEM_API_KEYS / TANDEM_API_KEYS_FILE (service.http.auth.ApiKeys) are keys that open
everything, as before scoped keys existed; TANDEM_KEYS_FILE (service.http.keyfile) holds scoped ones. A presented
key is compared with every digest by `hmac.compare_digest`, match or not, so timing reveals neither which key nor
how much of one matched.

A scoped key's filter is checked against every collection it may see when the keyring is built (at startup and at
each reload): a filter naming a field a collection lacks refuses that key (it opens nothing, and the error names its
id and the field, never the key). `KeySource` holds the keyring in service and swaps a new one in whole on SIGHUP or
when the file changes; a file that no longer reads keeps the keyring it had, so requests never see a half-read file.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starlette.requests import Request

from models.errors import InputError
from models.search import FilterError, parse_filter
from service.file_watch import FileWatch
from service.http.keyfile import ALL, KeyEntry, read_key_file
from service.redact import printable

log = logging.getLogger(__name__)

FieldsOf = Callable[[str], frozenset[str] | None]  # a collection's filter fields; None: not known now


@dataclass(frozen=True)
class KeyScope:
    """What one key may do: the collections it sees (None: all), the filter ANDed into its searches, embeddings."""

    id: str
    collections: frozenset[str] | None
    filter: dict[str, Any] | None
    embeddings: bool
    # the key's own partition of every cache its requests fill (service.core.query_cache): "" takes the id; each
    # legacy key, all of whose scopes are named "open", gets one of its own from its digest (`build_keyring`)
    cache_partition: str = ""

    def sees(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections

    @property
    def partition(self) -> str:
        """What caches are partitioned by: one key never reads what another's requests filled (a hit is observable,
        and would tell it what the other asked)."""
        return self.cache_partition or f"key:{self.id}"


# legacy keys (each with its own cache partition), and an open API (one partition: it cannot tell callers apart)
OPEN = KeyScope(id="open", collections=None, filter=None, embeddings=True, cache_partition="open")
KEY_STATE = "tandem_key"  # where service.http.auth's middleware leaves the matched key's scope in the request's state


def key_of(request: Request) -> KeyScope:
    """The scope of the key that opened this request (OPEN when the API needs no key)."""
    key = request.scope.get("state", {}).get(KEY_STATE)
    return key if isinstance(key, KeyScope) else OPEN


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class Keyring:
    """Digests and their scopes; `match` compares a presented key with every one of them."""

    def __init__(self, entries: Sequence[tuple[bytes, KeyScope]], refused: Sequence[str] = ()) -> None:
        self._entries = list(entries)
        self.refused = list(refused)  # why each refused key was refused (ids and fields, never keys)

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, presented: str) -> KeyScope | None:
        given = _digest(presented.encode("latin-1", errors="replace"))
        found: KeyScope | None = None
        for digest, scope in self._entries:  # every digest is compared, match or not
            if hmac.compare_digest(given, digest):
                found = scope
        return found


def scope_of(entry: KeyEntry) -> KeyScope:
    collections = None if entry.collections == [ALL] else frozenset(entry.collections)
    return KeyScope(id=entry.id, collections=collections, filter=entry.filter, embeddings=entry.embeddings)


def filter_problem(scope: KeyScope, collection: str, fields: frozenset[str]) -> str | None:
    """Why `scope`'s filter cannot apply to `collection` (whose filter fields are `fields`), or None."""
    if scope.filter is None:
        return None
    try:
        parse_filter(scope.filter, fields)
    except FilterError as exc:
        where = ".".join(str(p) for p in ("filter", *exc.path))
        return f"key {scope.id!r}: its {where} does not apply to collection {collection!r}: {exc.message}"
    return None


def build_keyring(legacy: Sequence[bytes], entries: Sequence[KeyEntry], collections: Sequence[str],
                  fields_of: FieldsOf) -> Keyring:
    """The keyring of the legacy digests (open everything) and the scoped entries, each scoped key's filter
    checked against every served collection it may see; a key that fails is refused (logged by id and field)."""
    scoped: list[tuple[bytes, KeyScope]] = []
    refused: list[str] = []
    for entry in entries:
        scope = scope_of(entry)
        unknown = sorted(scope.collections - set(collections)) if scope.collections is not None else []
        if unknown:
            log.warning("key %r names collections this service does not serve: %s", scope.id, printable(unknown))
        problems = [p for name in collections if scope.sees(name)
                    if (fields := fields_of(name)) is not None and (p := filter_problem(scope, name, fields))]
        if problems:
            log.error("refused %s", problems[0])
            refused.append(problems[0])
            continue
        scoped.append((entry.digest(), scope))
    legacy_digests = set(legacy)
    clash = [s.id for d, s in scoped if d in legacy_digests]
    if clash:
        raise InputError(f"TANDEM_KEYS_FILE: key {clash[0]!r} is also in TANDEM_API_KEYS(_FILE), which opens "
                         "everything: give each key one scope")
    legacy_scopes = [(d, replace(OPEN, cache_partition=f"legacy:{d.hex()}")) for d in legacy]
    return Keyring(legacy_scopes + scoped, refused)


class KeySource:
    """The keyring in service: built at startup (a bad key file raises, so the service refuses to start), rebuilt
    on SIGHUP and when TANDEM_KEYS_FILE changes (polled every `interval_s`); a rebuild that fails logs why and keeps
    the keyring in service."""

    def __init__(self, legacy: Sequence[bytes], file: Path | None, collections: Sequence[str], fields_of: FieldsOf,
                 interval_s: float) -> None:
        self._legacy, self.file, self._collections, self._fields_of = list(legacy), file, list(collections), fields_of
        self.interval_s = interval_s
        # SIGHUP and the file's changes (service.file_watch), from start() on
        self._watch = FileWatch(file, interval_s, self.reload, "tandem-keys") if file is not None else None
        self.current = self._build()  # an attribute read per request: swapped whole, never mutated
        self.reloads = 0
        self._lock = threading.Lock()  # one rebuild at a time (the watcher and SIGHUP)

    def _build(self) -> Keyring:
        entries = read_key_file(self.file) if self.file is not None else []
        return build_keyring(self._legacy, entries, self._collections, self._fields_of)

    def reload(self, why: str) -> bool:
        """Rebuild from the file now; False (the keyring in service kept) when it does not read."""
        if self._watch is None:
            return False
        with self._lock:
            self._watch.mark()
            try:
                keyring = self._build()
            except InputError as exc:
                log.error("key file reload (%s) refused, the keys in service stay: %s", why, printable(exc))
                return False
            self.current = keyring
            self.reloads += 1
        log.info("key file reloaded (%s): %d keys, %d refused", why, len(keyring), len(keyring.refused))
        return True

    def collections_changed(self, collections: Sequence[str], fields_of: FieldsOf) -> None:
        """The service's collections changed (a --config reload): its keys' filters are checked again against
        the collections served now."""
        with self._lock:
            self._collections, self._fields_of = list(collections), fields_of
        self.reload("collections changed")

    def start(self) -> None:
        """Watch the file (a thread polling its identity) and, on the main thread, take SIGHUP."""
        if self._watch is not None:
            self._watch.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
