"""Migration 0044 drops the write path's first lock function (``checkpoints_write_lock``,
migration 0039), which no release calls since 0041 added ``checkpoints_write_lock_v2``
(``locks.write_lock_sql``); going back re-creates it. PostgreSQL only: SQLite has no
such functions (the ORM path is its only one)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from checkpoints import locks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

_0044 = importlib.import_module("checkpoints.migrations.0044_drop_write_lock_v1")


def _functions() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'checkpoints_write_lock%%'")
        return {name for (name,) in cursor.fetchall()}


def test_only_the_function_the_write_path_calls_is_left():
    assert _functions() == {"checkpoints_write_lock_v2"}
    assert "checkpoints_write_lock_v2(" in locks.write_lock_sql()


def test_going_back_recreates_the_first_function_and_forward_drops_it_again():
    state = MigrationExecutor(connection).loader.project_state(
        ("checkpoints", "0043_audit_incident_search"))
    with transaction.atomic():
        with connection.schema_editor(atomic=False) as editor:
            _0044.recreate(state.apps, editor)
        assert _functions() == {"checkpoints_write_lock", "checkpoints_write_lock_v2"}
        with connection.schema_editor(atomic=False) as editor:
            _0044.drop(state.apps, editor)
        assert _functions() == {"checkpoints_write_lock_v2"}
