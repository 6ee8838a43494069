"""What may leave the server: error texts without host paths or library internals, log text without
control characters.

Errors raised while loading a bundle name files by their full path, which is right for an operator's
log and wrong for an HTTP body (it maps the host's file system for whoever holds a token). The full
text is logged where it happens; a client gets `public_error`, with every absolute path cut down to
its last component (a version or file name) and anything that is not one of our own errors replaced
by its type.
"""

from __future__ import annotations

import re

from models.errors import TandemError

_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])(?:/[^\s/:'\",;()\[\]<>]+)+/?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_PUBLIC_CHARS = 500


def _last_component(match: re.Match[str]) -> str:
    return match.group(0).rstrip("/").rsplit("/", 1)[-1]


def public_error(exc: BaseException) -> str:
    """A message for an HTTP body: ours with host paths cut to their last component, others by type only."""
    if not isinstance(exc, TandemError):
        return f"the bundle could not be loaded ({type(exc).__name__}); the server log has the details"
    return printable(_ABSOLUTE_PATH.sub(_last_component, str(exc)))[:MAX_PUBLIC_CHARS]


def printable(text: object) -> str:
    """`text` with control characters escaped (`\\n`, `\\x1b`…), so a file or directory name cannot forge
    or split a log line."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), str(text))
