"""What a tandem client raises: the server's own words when it answered, the transport's when it did not."""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error `tandem_client` raises."""


class ApiError(ClientError):
    """The server answered with an error status. `message` and `code` are the server's (its JSON error
    body); `request_id` is its X-Request-ID, the key to its logs; `attempts` counts retries included."""

    def __init__(self, status: int, code: str, message: str, request_id: str | None, attempts: int = 1,
                 retry_after: float | None = None) -> None:
        where = f" (request {request_id})" if request_id else ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"{status} {code}: {message}{where}{tries}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.attempts = attempts
        self.retry_after = retry_after


class TransportError(ClientError):
    """No answer: the connection failed or a timeout passed (the cause is chained)."""

    def __init__(self, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts
