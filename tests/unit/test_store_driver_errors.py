"""The fenced write is sent on the asyncpg driver (`Database.driver_scalar`), so its errors are the driver's own: the
checks that decide "the database cannot be reached right now" (the API's 503, a pool's wait) know them as they know
SQLAlchemy's wrapped ones, and nothing else is taken for an outage."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
import pytest

from crewwork.store.engine import store_unreachable, unavailable


def _error(cls: type[Exception], sqlstate: str) -> Exception:
    exc = cls("message")
    exc.sqlstate = sqlstate  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        _error(asyncpg.exceptions.CannotConnectNowError, "57P03"),
        _error(asyncpg.exceptions.AdminShutdownError, "57P01"),
        ConnectionResetError("reset by peer"),
    ],
)
def test_the_drivers_connection_errors_say_the_store_is_unreachable(exc: Exception) -> None:
    assert unavailable(exc)
    assert store_unreachable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        _error(asyncpg.exceptions.StringDataRightTruncationError, "22001"),
        _error(asyncpg.exceptions.UndefinedFunctionError, "42883"),
        _error(asyncpg.exceptions.UniqueViolationError, "23505"),
        ValueError("not a database error"),
    ],
)
def test_other_errors_are_not_an_outage(exc: Exception) -> None:
    assert not store_unreachable(exc)


def test_a_missing_server_side_function_names_the_migration() -> None:
    from crewwork.store.engine import older_schema

    missing = _error(asyncpg.exceptions.UndefinedFunctionError, "42883")
    missing.args = ("function crewwork_submit(text, text) does not exist",)
    err = older_schema(missing, "crewwork_submit", "0016")
    assert err is not None and "crewwork db upgrade" in str(err) and "migration 0016" in str(err)
    assert older_schema(missing, "crewwork_fenced_write", "0008") is None  # another function's absence
    other = _error(asyncpg.exceptions.UndefinedFunctionError, "42883")
    other.args = ("operator does not exist: text = integer",)
    assert older_schema(other, "crewwork_submit", "0016") is None
