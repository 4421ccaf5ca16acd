"""``manage.py migrate`` as a role that may not change the tables (the operator's walk,
item 2): during an upgrade, migrate with the app role's ``DATABASE_URL`` was a raw
``ProgrammingError: must be owner of table …`` traceback. It now refuses before any
migration, naming the role, the owner and the next steps (``dbroles.migrate_refusal``);
a privilege error met while migrating says the same."""

from __future__ import annotations

import io
import os
import secrets

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.core.management.commands import migrate as django_migrate
from django.db import ProgrammingError

from tests.security.conftest import django_connected_as, drop_roles


def _before_latest() -> str:
    """The name of the checkpoints app's second latest migration."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(connection).graph
    (latest,) = graph.leaf_nodes("checkpoints")
    (before,) = [p.key for p in graph.node_map[latest].parents if p.key[0] == "checkpoints"]
    return before[1]


def test_migrate_as_the_app_role_refuses_naming_the_owner(db_roles):
    # Unapplying the latest migration: a migrate with work to do (the test database has
    # every migration applied).
    with django_connected_as(db_roles.app), pytest.raises(CommandError) as refused:
        call_command("migrate", "checkpoints", _before_latest(), verbosity=0)
    text = str(refused.value)
    assert f"connected as {db_roles.app}, which does not own the tables" in text
    assert f"DATABASE_URL=postgres://{db_roles.owner}@" in text
    # The command it suggests is the one given (the newcomer's finding: a bare migrate).
    assert f"python manage.py migrate checkpoints {_before_latest()}." in text
    assert "setup_database_roles" in text and "Nothing was migrated" in text
    with django_connected_as(db_roles.app):  # only reads: not refused
        call_command("migrate", check_unapplied=True, verbosity=0)


def test_a_plain_migrate_with_nothing_to_apply_runs_as_the_app_role(db_roles):
    """An entrypoint that runs ``migrate`` at every start as the app role (stop 40's
    note): with nothing to apply it changes no table, and is not refused."""
    for args in ((), ("checkpoints",)):
        out = io.StringIO()
        with django_connected_as(db_roles.app):
            call_command("migrate", *args, stdout=out)
        assert "No migrations to apply." in out.getvalue(), args


def test_what_writes_without_a_migration_is_still_refused_and_named_whole(db_roles):
    """Stop 41's attack: ``migrate checkpoints --prune`` as the app role deleted rows of
    ``django_migrations`` (nothing to apply, so not refused); the refusal's suggested
    command left out ``--fake`` (pasted as the owner, it would really unapply); an unknown
    app label got the ownership paragraph instead of Django's own error."""
    with django_connected_as(db_roles.app), pytest.raises(CommandError) as refused:
        call_command("migrate", "checkpoints", prune=True, verbosity=0)
    assert "which does not own the tables" in str(refused.value)
    assert "python manage.py migrate checkpoints --prune." in str(refused.value)
    with django_connected_as(db_roles.app), pytest.raises(CommandError) as refused:
        call_command("migrate", "checkpoints", _before_latest(), fake=True, verbosity=0)
    assert f"migrate checkpoints {_before_latest()} --fake." in str(refused.value)
    with django_connected_as(db_roles.app), pytest.raises(CommandError) as refused:
        call_command("migrate", "no such app", verbosity=0)
    assert "No installed app with label 'no such app'" in str(refused.value)


@pytest.mark.django_db(transaction=True)
def test_migrate_on_a_superusers_tables_says_setup_database_roles_first(on_postgres):
    """A restore as the superuser, then migrate as the owner (before setup_database_roles):
    was ``permission denied for table django_migrations``."""
    if not on_postgres:
        pytest.skip("roles need PostgreSQL (set DATABASE_URL)")
    role = f"rcv_bare_{os.getpid()}_{secrets.token_hex(3)}"
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        with django_connected_as(role), pytest.raises(CommandError) as refused:
            call_command("migrate", verbosity=0)
        text = str(refused.value)
        assert f"connected as {role}, and the tables belong to" in text
        assert "a superuser" in text and "First run `manage.py setup_database_roles" in text
    finally:
        drop_roles(role)


@pytest.mark.django_db
def test_a_privilege_error_while_migrating_says_what_to_do(monkeypatch):
    """The fallback (both backends): SQLSTATE 42501 met by a migration is a CommandError
    with the same paragraph, not a traceback; any other database error is left alone."""
    def refused(self, *args, **options):
        try:
            raise psycopg.errors.InsufficientPrivilege("must be owner of table t")
        except psycopg.Error as exc:
            raise ProgrammingError("must be owner of table checkpoints_bulkaction") from exc

    monkeypatch.setattr(django_migrate.Command, "handle", refused)
    monkeypatch.setattr("checkpoints.dbroles.migrate_refusal", lambda cur, **kw: None)
    with pytest.raises(CommandError) as caught:
        call_command("migrate", verbosity=0)
    assert "must be owner of table checkpoints_bulkaction" in str(caught.value)
    assert "run migrate with the owner role's DATABASE_URL" in str(caught.value)

    def other(self, *args, **options):
        raise ProgrammingError("syntax error")

    monkeypatch.setattr(django_migrate.Command, "handle", other)
    with pytest.raises(ProgrammingError):
        call_command("migrate", verbosity=0)
