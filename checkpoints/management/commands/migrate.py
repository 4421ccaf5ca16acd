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
``migrate`` with nothing to apply (no arguments, or an app label alone: to the latest
migrations), which changes no table: an entrypoint that runs ``migrate`` at every start
as the app role (stop 40's note) then starts, and still stops when an upgrade brings a
migration. Everything else, and every option, is Django's.
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
                given = (options["app_label"], options["migration_name"])
                refusal = dbroles.migrate_refusal(cur, args=" ".join(a for a in given if a))
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
    """Whether ``migrate`` to the latest migrations (of every app, or of the app label
    given alone) has no migration to apply or unapply on ``conn``. A migrate naming a
    migration, or a role that may not even read the applied migrations, is judged as
    before (``False``); so is an unknown app label (Django's own error then says so)."""
    app = options.get("app_label")
    if options.get("migration_name"):
        return False
    try:
        executor = MigrationExecutor(conn)
    except DatabaseError:  # e.g. no right to read django_migrations: the refusal says why
        return False
    targets = [key for key in executor.loader.graph.leaf_nodes() if app in (None, key[0])]
    return bool(targets) and not executor.migration_plan(targets)
