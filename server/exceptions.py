"""Exceptions the engine raises. Each names the offending value so that the HTTP layer
can turn it into an OpenAI-style error body without guessing."""

from __future__ import annotations

from pathlib import Path


class ArgosyError(Exception):
    """Base of every error the engine raises on purpose."""

    exit_code = 1  # of `argosy serve`, when this stops the model from loading


class CheckpointError(ArgosyError):
    """A checkpoint folder is missing a file, holds a corrupt one, or cannot be served."""

    def __init__(self, path: str | Path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class CheckpointNotFoundError(CheckpointError):
    """The checkpoint folder, its config.json or its weights are not there: the model is not
    on this node. `argosy serve` exits with `exit_code`, which the operator reports as
    ModelPathMissing."""

    exit_code = 66  # sysexits' EX_NOINPUT: an input file did not exist


class UnsupportedModelError(CheckpointError):
    """The checkpoint's architecture or one of its settings is not implemented."""


class InvalidRequestError(ArgosyError, ValueError):
    """A request or a sampling parameter is out of range; `param` names the field."""

    status = 400  # its HTTP status
    code: str | None = None  # the error body's code

    def __init__(self, message: str, param: str | None = None):
        self.param = param
        super().__init__(message)


class NotFoundError(InvalidRequestError):
    """The request names what is not served (a model or adapter name)."""

    status = 404
    code = "model_not_found"


class ConflictError(InvalidRequestError):
    """The request would replace what is served without asking to (an adapter name in use)."""

    status = 409
    code = "conflict"


class TooManyRequestsError(InvalidRequestError):
    """The client has its share of some bounded work under way already; it may retry later."""

    status = 429
    code = "rate_limit_exceeded"


class EngineFailedError(ArgosyError):
    """A request failed in the engine (a bug, or the device): it ends with this error, a 500."""


class EngineDeadError(EngineFailedError):
    """The engine core's process is gone or hung: nothing in flight can finish."""


class EndpointInUseError(ArgosyError):
    """An endpoint a setting names that cannot be bound (in use, or not this host's): the start fails at once."""
