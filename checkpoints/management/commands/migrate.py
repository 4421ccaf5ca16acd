"""``manage.py migrate``: Django's ``migrate``, refusing with what to do when the
connected PostgreSQL role may not change the tables (the operator's walk, item 2: run
with the app role's ``DATABASE_URL`` during an upgrade it was a raw ``ProgrammingError:
must be owner of table …`` traceback).

Before migrating, on PostgreSQL, ``dbroles.migrate_refusal``: when a table of the schema
belongs to a role the connected one has not the rights of, exits 1 (``CommandError``)
naming the role, the table's owner and the next steps (migrate as the owner, then
``setup_database_roles``; or, tables of a superuser after a restore,
``setup_database_roles`` first), before any migration runs. A migration that still fails
for lack of privilege (SQLSTATE 42501) exits 1 with the same paragraph and the
database's first line; the migrations applied before it stay applied (each runs in its
own transaction). ``--plan`` and ``--check`` only read, and are not refused; nor is a
plain ``migrate`` (no app label) with nothing to apply, which changes no table: an
entrypoint that runs ``migrate`` at every start as the app role (stop 40's note) then
starts, and still stops when an upgrade brings a migration. Everything else, and every
option, is Django's.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.core.management.commands import migrate
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from checkpoints import dbroles

INSUFFICIENT_PRIVILEGE = "42501"


class Command(migrate.Command):
    def handle(self, *args, **options):
        conn = connections[options["database"]]
        if (conn.vendor == "postgresql" and not (options["plan"] or options["check_unapplied"])
                and not _nothing_to_apply(conn, options)):
            with conn.cursor() as cur:
                refusal = dbroles.migrate_refusal(cur)
            if refusal:
                raise CommandError(refusal)
        try:
            return super().handle(*args, **options)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
                raise
            first = str(exc).strip().splitlines()[0]
            raise CommandError(f"migrate: the database refused ({first}). "
                               f"{dbroles.MIGRATE_AS_OWNER}") from None


def _nothing_to_apply(conn, options) -> bool:
    """Whether a plain ``migrate`` (no app label, so every app to its latest migration)
    has no migration to apply or unapply on ``conn``. A migrate naming an app or a
    migration, or a role that may not even read the applied migrations, is judged as
    before (``False``)."""
    if options.get("app_label"):
        return False
    try:
        executor = MigrationExecutor(conn)
    except DatabaseError:  # e.g. no right to read django_migrations: the refusal says why
        return False
    return not executor.migration_plan(executor.loader.graph.leaf_nodes())
