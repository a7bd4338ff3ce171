"""Errors with an HTTP meaning, raised by cores (which never import Flask) and turned
into `{"error", "message"}` answers by `common.http`."""

from __future__ import annotations


class ApiError(Exception):
    """An error answer: HTTP status, a stable code, and a message saying what to fix."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


def bad_request(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid", f"{field}: {message}" if field else message)


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} does not exist")


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)
