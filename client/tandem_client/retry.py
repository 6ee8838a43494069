"""When to try again: 429 and 503 after the server's Retry-After, within one time budget per call.

The budget bounds the whole call, waits and attempts together: a wait that would end past it
is not started, and each attempt's timeout is cut to what is left. Without a Retry-After the
wait grows exponentially with jitter, so clients refused together do not return together.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """budget_s: the most a call may take, retries included; max_attempts: attempts per call (1: never
    retry); backoff_s/max_backoff_s: the waits when the server names none."""

    budget_s: float = 30.0
    max_attempts: int = 5
    backoff_s: float = 0.25
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.max_attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"invalid retry policy {self}: budget_s > 0, max_attempts >= 1, backoffs >= 0")

    def backoff(self, attempt: int) -> float:
        """The wait after the `attempt`-th failure when the server gave no Retry-After (full jitter)."""
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


def retry_after_s(response: httpx.Response) -> float | None:
    """Retry-After in seconds (a number or an HTTP date), or None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Attempts:
    """The retry state of one call; `next_wait` says how long to sleep before the next attempt, or None."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.started = time.monotonic()
        self.count = 0

    def remaining(self) -> float:
        return self.policy.budget_s - (time.monotonic() - self.started)

    def timeout(self, configured: httpx.Timeout) -> httpx.Timeout:
        """The client's timeouts, none longer than what is left of the budget."""
        left = max(self.remaining(), 0.001)

        def cut(value: float | None) -> float:
            return left if value is None else min(value, left)

        return httpx.Timeout(connect=cut(configured.connect), read=cut(configured.read),
                             write=cut(configured.write), pool=cut(configured.pool))

    def next_wait(self, retry_after: float | None) -> float | None:
        """After attempt `count` failed retryably: the wait before the next one, or None to give up."""
        if self.count >= self.policy.max_attempts:
            return None
        wait = retry_after if retry_after is not None else self.policy.backoff(self.count)
        if wait >= self.remaining():
            return None  # the next attempt could not even start within the budget
        return wait
