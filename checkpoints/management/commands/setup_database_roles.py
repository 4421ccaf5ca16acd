"""``manage.py setup_database_roles --owner ROLE --app ROLE [--print]``: the least-privilege
PostgreSQL set-up of docs/security/audit.md (``checkpoints.dbroles``).

Creates (if missing) and configures an owner role, which owns the tables and the audit
trigger function and runs ``migrate``, and an app role, which the service runs as and
which can append to the audit trail but not change, empty, or un-trigger it. Runs on the
configured database (``DATABASE_URL``) in one transaction, as a superuser; idempotent, so
re-run it after each ``migrate``. On a database not migrated yet (an empty one) it does
part 1 only (``dbroles.role_bootstrap_sql``: roles, schema, default privileges), exits 0
and says to run ``migrate`` as the owner and then the command again, which does the rest
(issue 17, item 4). ``--print`` only prints the SQL of both parts (any backend).

Exits 1 (``CommandError``) naming the field for a bad role name, and when the database is
not PostgreSQL, the connected role is not a superuser, or the final check finds the app
role could still change the audit trail. Not audited: it concerns no tenant.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection, transaction

from checkpoints import dbroles


class Command(BaseCommand):
    help = "Create the owner and app PostgreSQL roles (least privilege for the audit trail)."

    def add_arguments(self, parser):
        parser.add_argument("--owner", required=True,
                            help="role that owns the tables and runs migrate")
        parser.add_argument("--app", required=True, help="role the service connects as")
        parser.add_argument("--print", action="store_true", dest="print_only",
                            help="print the SQL instead of running it")

    def handle(self, *args, owner: str, app: str, print_only: bool, **options):
        try:
            dbroles.role_setup_sql(owner=owner, app=app)  # checks the names
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if print_only:
            self.stdout.write(dbroles.role_setup_script(owner=owner, app=app), ending="")
            return
        if connection.vendor != "postgresql":
            raise CommandError("database: roles need PostgreSQL (set DATABASE_URL); "
                               "--print shows the SQL")
        with connection.cursor() as cur:
            cur.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
            user, is_super = cur.fetchone()
        if not is_super:
            raise CommandError(f"database: connected as {user}, which is not a superuser; run "
                               "this as one, or run the SQL of --print as one")
        try:
            with transaction.atomic(), connection.cursor() as cur:
                for sql in dbroles.role_bootstrap_sql(owner=owner, app=app):
                    cur.execute(sql)
                missing = dbroles.missing_objects(cur)
                if not missing:
                    for sql in dbroles.role_lockdown_sql(owner=owner, app=app):
                        cur.execute(sql)
        except DatabaseError as exc:
            raise CommandError(f"database: {str(exc).strip().splitlines()[0]}") from None
        if missing:
            self.stdout.write(
                f"roles ready, set-up not finished: owner {owner}, app {app} exist, and the "
                f"owner's future tables will give the app its rights; the database has no "
                f"{', '.join(missing)} yet.\n"
                f"Next: run `python manage.py migrate` as {owner} (DATABASE_URL="
                f"postgres://{owner}@HOST:PORT/{connection.settings_dict['NAME']}), then this "
                "command again: it hands the remaining tables to the owner, limits the app "
                "role on the audit trail and checks it.")
            return
        self.stdout.write(f"roles ready: owner {owner} (owns the tables; run migrate as it), "
                          f"app {app} (the service's DATABASE_URL)")
