"""``sql.WriteTransaction`` (issue 22, item 2) ends every block with the session out of
pipeline mode and out of any transaction, and a failed statement comes out as Django's
error, whenever its result reaches the client: at the closing sync (the usual case), or
earlier, inside the block, which happens when the server answers before the block ends
(a loaded machine; stop 36 saw ``test_the_write_transactions_failed_commit…`` fail so:
the block's ``IntegrityError`` replaced by psycopg's "pipeline aborted" from the
``ROLLBACK`` queued behind it, and the connection left in pipeline mode for the next
request of that web thread). PostgreSQL only (SQLite has no SQL write path)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection

from checkpoints import sql
from checkpoints.models import GraphCheckpoint

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _insert_null(cur) -> None:
    cur.execute(f"INSERT INTO {sql.table(GraphCheckpoint)} (id) VALUES (NULL)")


def _session_is_clean() -> None:
    raw = connection.connection
    assert raw._pipeline is None, "the connection was left in pipeline mode"
    assert connection.in_atomic_block is False
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
    assert raw.pgconn.transaction_status == 0  # IDLE: no transaction left open


def test_a_failed_statement_read_at_the_closing_sync_is_djangos_error():
    with pytest.raises(IntegrityError):
        with sql.WriteTransaction(), sql.cursor() as cur:
            _insert_null(cur)
    _session_is_clean()


def test_a_failed_statement_whose_answer_came_inside_the_block_is_djangos_error():
    with pytest.raises(IntegrityError):
        with sql.WriteTransaction(), sql.cursor() as cur:
            _insert_null(cur)
            # The server's answer read now, through Django's wrapper as a statement of
            # the block would read it (``sql.cursor`` is Django's cursor).
            with connection.wrap_database_errors:
                connection.connection._pipeline.sync()
    _session_is_clean()


def test_an_error_of_the_callers_own_rolls_back_and_is_the_one_raised():
    with pytest.raises(ZeroDivisionError):
        with sql.WriteTransaction(), sql.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {sql.table(GraphCheckpoint)}")
            1 / 0  # noqa: B018 - the caller's own failure inside the block
    _session_is_clean()


def test_the_callers_error_after_a_failed_statement_is_the_one_raised():
    with pytest.raises(KeyError):
        with sql.WriteTransaction(), sql.cursor() as cur:
            _insert_null(cur)
            raise KeyError("the caller's")
    _session_is_clean()


@pytest.mark.parametrize("block_fails", [False, True], ids=["commit", "rollback"])
def test_an_end_the_pipeline_refuses_still_leaves_pipeline_mode(monkeypatch, block_fails):
    """The end (``COMMIT``, or ``ROLLBACK`` after the block's own error) refused by an
    aborted pipeline, as psycopg does when a failed statement's answer came first: the
    session leaves pipeline mode and its transaction all the same, and the error raised
    is the block's own, else Django's form of the refusal."""
    transaction_ = sql.WriteTransaction()
    transaction_.__enter__()
    raw = connection.connection
    real = raw.execute

    def refuse_the_end(query, *args, **kwargs):
        if query in ("COMMIT", "ROLLBACK") and raw._pipeline is not None:
            raise psycopg.errors.PipelineAborted("pipeline aborted")
        return real(query, *args, **kwargs)

    monkeypatch.setattr(raw, "execute", refuse_the_end)
    with sql.cursor() as cur:
        cur.execute("SELECT 1")
    if block_fails:
        error = KeyError("the caller's")
        with pytest.raises(KeyError):
            if not transaction_.__exit__(KeyError, error, None):
                raise error
    else:
        with pytest.raises(OperationalError):
            transaction_.__exit__(None, None, None)
    monkeypatch.undo()
    _session_is_clean()
