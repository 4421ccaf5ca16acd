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
migrations; not ``--prune`` nor ``--run-syncdb``, which write without a migration), so an
entrypoint that runs ``migrate`` at every start as the app role (stop 40's note) starts,
and still stops when an upgrade brings a migration. Such a run changes no table's
structure; Django's ``post_migrate`` handlers may still insert a missing permission or
content type row, which the app role's ordinary rights allow anyway. An app label Django
does not know gets Django's own error. The refusal repeats the command as given
(arguments and the options that change what it does, shell-quoted). Everything else, and
every option, is Django's.
"""

from __future__ import annotations

import shlex

from django.apps import apps
from django.core.management.base import CommandError
from django.core.management.commands import migrate
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from checkpoints import dbroles

INSUFFICIENT_PRIVILEGE = "42501"


class Command(migrate.Command):
    def handle(self, *args, **options):
        conn = connections[options["database"]]
        if (conn.vendor == "postgresql" and not (options["plan"] or options["check_unapplied"])
                and not _unrefused(conn, options)):
            with conn.cursor() as cur:
                refusal = dbroles.migrate_refusal(cur, args=_given(options))
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



def _unrefused(conn, options) -> bool:
    """Whether this ``migrate`` runs without the ownership check: an app label Django does
    not know (its own error then says so), or a migrate to the latest migrations (of every
    app, or of the app label given alone; no ``--prune``, no ``--run-syncdb``) with no
    migration to apply or unapply on ``conn``. ``False`` for a role that may not even
    read the applied migrations (the refusal says why)."""
    app = options.get("app_label")
    if app:
        try:
            apps.get_app_config(app)
        except LookupError:
            return True
    if options.get("migration_name") or options.get("prune") or options.get("run_syncdb"):
        return False
    try:
        executor = MigrationExecutor(conn)
    except DatabaseError:  # e.g. no right to read django_migrations: the refusal says why
        return False
    targets = [key for key in executor.loader.graph.leaf_nodes() if app in (None, key[0])]
    return bool(targets) and not executor.migration_plan(targets)


#: The options repeated in the refusal's suggested command: those that change what a
#: migrate does (``--fake`` pasted away would really unapply).
_GIVEN_FLAGS = {"fake": "--fake", "fake_initial": "--fake-initial", "prune": "--prune",
                "run_syncdb": "--run-syncdb"}


def _given(options) -> str:
    """The arguments and options of this ``migrate``, shell-quoted, as the refusal's
    suggested command repeats them."""
    words = [options[k] for k in ("app_label", "migration_name") if options.get(k)]
    words += [flag for key, flag in _GIVEN_FLAGS.items() if options.get(key)]
    if options.get("database", DEFAULT_DB_ALIAS) != DEFAULT_DB_ALIAS:
        words += ["--database", options["database"]]
    return " ".join(shlex.quote(w) for w in words)
