"""Errors every route can raise, formatted by each dialect (OpenAI, Anthropic, SGLang) into its own body."""

from __future__ import annotations

__all__ = ["ApiError"]


class ApiError(Exception):
    """An HTTP error with a dialect-neutral ``kind``.

    Kinds: ``invalid_request``, ``authentication``, ``permission``, ``not_found``, ``request_too_large``,
    ``rate_limit``, ``overloaded``, ``api_error``.
    """

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @classmethod
    def invalid(cls, message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
        return cls(400, "invalid_request", message, param=param, code=code)
