"""An optional per-stage timing hook, so the service can export latencies without models knowing about metrics."""

from __future__ import annotations

from collections.abc import Callable

# Called with a stage name ("tokenize", "rescore") and its duration in seconds, from the calling thread.
StageObserver = Callable[[str, float], None]
