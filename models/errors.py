"""Errors that cross package boundaries; each carries a message meant for an operator."""


class TandemError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""


class ContractMismatch(TandemError):
    """A student, bundle or query does not live in the embedding space it claims."""


class InputError(TandemError):
    """Bad input data; the message names the file and line."""


class ModelNotFound(TandemError):
    """A model directory or weight package is missing; the message says what to install."""


class DeadlineExceeded(TandemError):
    """A search ran past its deadline: checked between segments and stages (models.search.query), so the worker it
    held is free again; the service answers 503 with Retry-After."""
