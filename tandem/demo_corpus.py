"""The default corpus for `make demo`: docstrings of Python's standard library.

Why this corpus: it is on every machine with Python, needs no network, is under the PSF
license, and people can judge the answers ("parse a JSON string" → `json.loads`). The module
list is fixed, the walk is ordered and it runs in a fresh interpreter (libraries loaded in the
caller, such as torch and transformers, patch stdlib objects), so a given Python always writes
the same bytes and the demo's embedding cache is reused on a second run.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from models.atomic import atomic_write
from models.errors import InputError, TandemError

log = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parents[1]
_WALK = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from tandem.demo_corpus import print_demo_docs; print_demo_docs()"
)

# Everyday modules first: `tandem demo serve` indexes the walk's first DEMO_DOCS records, which on CPython 3.11
# are these first modules' (up to `secrets`); the rest follow for a larger `--max-docs` and `tandem demo corpus`.
MODULES = (
    "json", "os", "os.path", "re", "pathlib", "collections", "itertools", "functools", "datetime", "time",
    "subprocess", "shutil", "string", "textwrap", "math", "random", "hashlib", "base64", "csv", "urllib.parse",
    "logging", "argparse", "dataclasses", "enum", "heapq", "bisect", "gzip", "tempfile", "glob", "fnmatch", "uuid",
    "threading", "queue", "concurrent.futures", "contextlib", "copy", "pickle", "io", "sys", "traceback", "operator",
    "secrets",
    "sqlite3", "urllib.request", "zipfile", "difflib", "statistics", "http.client", "configparser", "tomllib",
    "struct", "warnings", "pprint", "cmath", "hmac", "binascii", "zlib", "http.server", "http.cookies", "email",
    "email.message", "email.utils", "smtplib", "mimetypes", "logging.handlers", "typing", "abc", "numbers", "array",
    "weakref", "graphlib", "tarfile", "bz2", "lzma", "filecmp", "stat", "calendar", "zoneinfo", "ipaddress", "socket",
    "selectors", "sched", "asyncio", "contextvars", "shelve", "codecs", "inspect", "atexit", "unittest",
    "unittest.mock", "doctest", "timeit", "reprlib", "decimal", "fractions", "html", "html.parser",
    "xml.etree.ElementTree", "getpass", "platform", "signal", "shlex", "locale", "gettext", "unicodedata",
    "importlib", "pkgutil",
)  # fmt: skip

# How many records `tandem demo serve` indexes: the everyday modules above. Sized so that a fresh machine serves
# within four minutes (issue 58): the teacher's passes over the documents and their pseudo-queries, and the student's
# training, grow with it (docs/lab/2026-11-28-demo-lean.md); `--max-docs 3000` takes the whole walk.
DEMO_DOCS = 1000
MIN_DOC_CHARS = 40
MAX_DOC_CHARS = 700
MAX_SIGNATURE_CHARS = 160


_RST_LITERAL = re.compile(r"``([^`]+)``")
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def _plain(doc: str) -> str:
    """Drop reST markup (``x``, :func:`x`): noise to the encoder and to a reader of results."""
    return _RST_ROLE.sub(r"\1", _RST_LITERAL.sub(r"\1", doc))


def _truncate(doc: str, limit: int = MAX_DOC_CHARS) -> str:
    """Cut at the last paragraph, else sentence, else word boundary that fits."""
    if len(doc) <= limit:
        return doc
    head = doc[:limit]
    for sep, keep in (("\n\n", 0), (". ", 1), ("\n", 0)):
        cut = head.rfind(sep)
        if cut >= limit // 2:
            return head[: cut + keep].rstrip()
    return head.rsplit(None, 1)[0].rstrip() + " …"


class _Shown:
    """A default value as it should print in a signature."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _shown_default(value: object) -> _Shown:
    """Literals as written; anything else (objects, handler lists, sentinels, absolute paths
    such as sys.executable) as `…`, because those carry addresses or process state and would
    change the output run to run."""
    literal = isinstance(value, bytes | int | float | type(None)) or (
        isinstance(value, str) and not value.startswith(os.sep)
    ) or (isinstance(value, tuple) and all(isinstance(v, str | bytes | int | float) for v in value))
    text = repr(value)
    return _Shown(text if literal and len(text) <= 40 else "…")


def _signature(obj: object) -> str | None:
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    params = [
        p.replace(
            annotation=p.empty,
            default=p.empty if p.default is p.empty else _shown_default(p.default),
        )
        for p in sig.parameters.values()
    ]
    text = str(sig.replace(parameters=params, return_annotation=sig.empty))
    if len(text) <= MAX_SIGNATURE_CHARS:
        return text
    return text[: MAX_SIGNATURE_CHARS - 3].rsplit(", ", 1)[0] + ", …)"


def _own_doc(obj: object) -> str:
    """The object's own docstring (not one inherited from a base class), cleaned."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc).strip() if isinstance(doc, str) else ""


def _from_stdlib(obj: object) -> bool:
    """False for things patched in from outside the stdlib (e.g. by a `.pth` file at startup)."""
    home = getattr(obj, "__module__", None)
    return not isinstance(home, str) or home.split(".")[0] in sys.stdlib_module_names


def _is_routine(obj: object) -> bool:
    return inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj) or (
        inspect.ismethoddescriptor(obj) and callable(obj)
    )


def _public_members(module: ModuleType) -> Iterator[tuple[str, object]]:
    """Module attributes that are its own public API: `__all__`, else names defined in it."""
    names = getattr(module, "__all__", None)
    if names is None:
        homes = {module.__name__, "_" + module.__name__.rsplit(".", 1)[-1]}
        names = [
            n for n in dir(module)
            if getattr(getattr(module, n), "__module__", None) in homes
        ]
    for name in sorted(set(names)):
        obj = getattr(module, name, None)
        if not name.startswith("_") and obj is not None and _from_stdlib(obj):
            yield name, obj


def _class_methods(cls: type) -> Iterator[tuple[str, object]]:
    """Public methods a class defines itself (inherited ones belong to their base)."""
    for name, raw in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        func = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
        if _is_routine(func):
            yield name, func


def iter_demo_docs() -> Iterator[dict[str, str]]:
    """One record per documented public function, class and method, in a fixed order."""
    seen: set[int] = set()

    def first_time(obj: object) -> bool:
        key = id(getattr(obj, "__func__", obj))  # bound methods are fresh objects on each access
        if key in seen:
            return False
        seen.add(key)
        return True

    def record(qualname: str, obj: object) -> dict[str, str] | None:
        doc = _own_doc(obj)
        if len(doc) < MIN_DOC_CHARS:
            return None
        sig = _signature(obj)
        return {"_id": qualname, "title": qualname + (sig or ""), "text": _truncate(_plain(doc))}

    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            log.warning("demo corpus: skipping %s (%s)", module_name, exc)
            continue
        members = [(f"{module_name}.{name}", obj) for name, obj in _public_members(module)]
        members = [(q, obj) for q, obj in members if (inspect.isclass(obj) or _is_routine(obj)) and first_time(obj)]
        # Module-level names first, so `random.randint` wins over `random.Random.randint`.
        methods = [
            (f"{qualname}.{name}", meth)
            for qualname, cls in members if inspect.isclass(cls)
            for name, meth in _class_methods(cls)
        ]
        for qualname, obj in members + [(q, m) for q, m in methods if first_time(m)]:
            if (rec := record(qualname, obj)) is not None:
                yield rec


def print_demo_docs() -> None:
    """Write the records to stdout as ASCII JSON lines (the child side of write_demo_corpus)."""
    for rec in iter_demo_docs():
        sys.stdout.write(json.dumps(rec) + "\n")


def write_demo_corpus(out: Path, max_docs: int = 3000) -> int:
    """Write up to `max_docs` stdlib docstrings as BEIR JSONL, atomically; returns the count."""
    if max_docs < 1:
        raise InputError(f"max_docs must be at least 1, got {max_docs}")
    # -I: no PYTHON* variables, no user site; only the stdlib as this Python ships it.
    child = subprocess.run(
        [sys.executable, "-I", "-c", _WALK, str(_REPO)], stdout=subprocess.PIPE, encoding="ascii"
    )
    if child.returncode != 0:
        raise TandemError(f"building the demo corpus failed (exit {child.returncode}; see the messages above)")
    lines = child.stdout.splitlines()[:max_docs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda fh: fh.write("".join(line + "\n" for line in lines).encode("utf-8")))
    records = [json.loads(line) for line in lines]
    words = sum(len(f"{r['title']} {r['text']}".split()) for r in records)
    log.info("demo corpus %s: %d documents, ~%.0f tokens each", out, len(lines), 1.3 * words / max(len(lines), 1))
    return len(lines)
