"""Least-privilege PostgreSQL roles for the service (issue 6, fault 2; docs/security/audit.md).

Two roles:

- the **owner** owns every table of the schema and the audit trigger function, and is the
  role ``manage.py migrate`` runs as. Only it (or a superuser) can alter, disable or drop
  the audit triggers, so its credentials stay out of the running service.
- the **app** role is what the web nodes and workers connect as. It has the ordinary
  rights (SELECT, INSERT, UPDATE, DELETE) on every table except the audit trail: on the
  event table, the tenant registry and the Merkle tree's leaves, nodes and signed heads
  only SELECT and INSERT, on the sequencer's queue (``AuditPending``) SELECT, INSERT and
  DELETE (the sequencer deletes what it integrated; the verifier finds an event neither in
  the tree nor queued), on the chain heads SELECT, INSERT and UPDATE (the tenant's write
  gate; the verifier checks the legacy chain's end against the events). It owns
  nothing, is no superuser and no member of the owner, and cannot create objects in the
  schema (which also keeps it from planting functions the owner's migrations would run).

The set-up has two parts (issue 17, item 4: on an empty database the second cannot run):
``role_bootstrap_sql`` (the roles, the schema's rights, the ``pg_trgm`` extension and the
owner's default privileges: needs no table) and ``role_lockdown_sql`` (ownership of the
tables and the trigger function, the audit trail's rights, the final check: needs what
``migrate`` creates). ``manage.py setup_database_roles`` runs part 1, then part 2 if the
database is migrated (``missing_objects``), else says to run ``migrate`` as the owner and
then the command again; ``--print`` prints both. Every statement is idempotent, so it is
re-run after each ``migrate`` as a check (default privileges already give the app its
rights on new tables). The last statement refuses (raises) when the app role could still
change the audit trail.
"""

from __future__ import annotations

import re

from .models import (
    AuditChainHead,
    AuditEvent,
    AuditLeaf,
    AuditPending,
    AuditTenant,
    AuditTreeHead,
    AuditTreeNode,
)

ROLE_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")
TRIGGER_FUNCTIONS = ("checkpoints_audit_append_only()", "checkpoints_audit_seq()",
                     "checkpoints_audit_queue()")
#: The Merkle tree's tables (issue 22, item 1): the app role may only read and append.
TREE_TABLES = (AuditLeaf, AuditTreeNode, AuditTreeHead)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def check_role_name(field: str, name: str) -> str:
    """Return ``name`` if it is a plain lower-case PostgreSQL role name, else raise
    ``ValueError`` naming ``field`` (letters, digits, ``_``; at most 63; not ``pg_*``)."""
    if not isinstance(name, str) or not ROLE_RE.match(name) or name.startswith("pg_"):
        raise ValueError(f"{field}: a role name of lower-case letters, digits and '_' "
                         "(not starting with a digit or pg_), at most 63 characters")
    return name


def _names(owner: str, app: str) -> None:
    check_role_name("--owner", owner)
    check_role_name("--app", app)
    if owner == app:
        raise ValueError("--app: must differ from --owner (the owner can disable triggers)")


def role_bootstrap_sql(*, owner: str, app: str, schema: str = "public") -> list[str]:
    """Part 1 of the set-up: what needs no table, so it runs on an empty database too.

    Creates the owner and app roles (``LOGIN``, no password), gives the owner ``CONNECT``,
    ``USAGE`` and ``CREATE`` on the schema, the app ``CONNECT`` and ``USAGE`` only (``CREATE``
    revoked from ``PUBLIC`` and the app), takes the app out of the owner, creates the
    ``pg_trgm`` extension migration 0012 needs (the owner may not), and sets the owner's
    default privileges so the tables its ``migrate`` creates give the app its ordinary
    rights. Run as a superuser, in the service's database. Raises ``ValueError`` naming
    ``--owner``/``--app`` for a bad or equal role name.
    """
    _names(owner, app)
    o, a, s = _ident(owner), _ident(app), _ident(schema)
    return [
        # 1. The roles (LOGIN; set their passwords yourself, e.g. psql's \password).
        f"""DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_lit(owner)}) THEN
        CREATE ROLE {o} LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_lit(app)}) THEN
        CREATE ROLE {a} LOGIN;
    END IF;
END $$""",
        f"ALTER ROLE {o} LOGIN",
        f"ALTER ROLE {a} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS",
        f"REVOKE {o} FROM {a}",
        # 2. The database and the schema: only the owner creates objects.
        f"""DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO {o}, {a}', current_database());
END $$""",
        f"GRANT USAGE, CREATE ON SCHEMA {s} TO {o}",
        f"REVOKE CREATE ON SCHEMA {s} FROM PUBLIC",
        f"REVOKE CREATE ON SCHEMA {s} FROM {a}",
        f"GRANT USAGE ON SCHEMA {s} TO {a}",
        # The search's trigram indexes (migration 0012) need the extension, which the
        # owner (not the database's owner, no CREATE on it) may not create.
        f"CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA {s}",
        # 3. The app's ordinary rights on the owner's future tables (its migrate).
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA {s} "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {a}",
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA {s} "
        f"GRANT USAGE, SELECT ON SEQUENCES TO {a}",
    ]


def role_lockdown_sql(*, owner: str, app: str, schema: str = "public") -> list[str]:
    """Part 2 of the set-up, once ``migrate`` has created the tables and the trigger
    function: the owner owns every table and the function, the app has its ordinary rights
    on the tables that exist, only ``SELECT, INSERT`` on the events and ``SELECT, INSERT,
    UPDATE`` on the chain heads, and the last statement raises when the app role could
    still change the audit trail. Needs ``role_bootstrap_sql`` first (the roles). Raises
    ``ValueError`` as ``role_bootstrap_sql`` does.
    """
    # Long on purpose: the lockdown's statements in their order, read as one script.
    _names(owner, app)
    o, a, s = _ident(owner), _ident(app), _ident(schema)
    events, heads = AuditEvent._meta.db_table, AuditChainHead._meta.db_table
    registry = AuditTenant._meta.db_table
    pending = AuditPending._meta.db_table
    tree = ", ".join(f"{s}.{_ident(m._meta.db_table)}" for m in TREE_TABLES)
    tree_checks = "".join(
        f"       OR has_table_privilege(app_role, {_lit(schema + '.' + m._meta.db_table)}, '{r}')\n"
        for m in TREE_TABLES for r in ("UPDATE", "DELETE", "TRUNCATE", "TRIGGER"))
    tree_checks += "".join(
        f"       OR has_table_privilege(app_role, {_lit(schema + '.' + pending)}, '{r}')\n"
        for r in ("UPDATE", "TRUNCATE", "TRIGGER"))
    return [
        # 4. The owner owns every table (their identity sequences follow) and the trigger
        #    function: only it can ALTER, DISABLE or DROP the triggers, or replace the function.
        f"""DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = {_lit(schema)} AND c.relkind IN ('r', 'p')
               AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.objid = c.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER TABLE %I.%I OWNER TO %I', {_lit(schema)}, t.relname, {_lit(owner)});
    END LOOP;
END $$""",
        *(f"ALTER FUNCTION {schema}.{f} OWNER TO {o}" for f in TRIGGER_FUNCTIONS),
        # 5. The app: ordinary rights on the tables that exist ...
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {a}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {a}",
        # ... except the audit trail: append events, move the head, nothing else.
        f"REVOKE ALL ON {s}.{_ident(events)}, {s}.{_ident(heads)}, {s}.{_ident(registry)} "
        f"FROM PUBLIC, {a}",
        f"GRANT SELECT, INSERT ON {s}.{_ident(events)} TO {a}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.{_ident(heads)} TO {a}",
        f"GRANT SELECT, INSERT ON {s}.{_ident(registry)} TO {a}",
        # ... the tree: append leaves, nodes and heads; the queue: also delete from it.
        f"REVOKE ALL ON {tree}, {s}.{_ident(pending)} FROM PUBLIC, {a}",
        f"GRANT SELECT, INSERT ON {tree} TO {a}",
        f"GRANT SELECT, INSERT, DELETE ON {s}.{_ident(pending)} TO {a}",
        # 6. Refuse to finish when the app role could still change the audit trail.
        f"""DO $$
DECLARE
    app_role text := {_lit(app)};
    events regclass := {_lit(schema + '.' + events)};
    heads regclass := {_lit(schema + '.' + heads)};
    registry regclass := {_lit(schema + '.' + registry)};
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = app_role) THEN
        RAISE EXCEPTION 'app role % is a superuser', app_role;
    END IF;
    IF pg_has_role(app_role, {_lit(owner)}, 'MEMBER') THEN
        RAISE EXCEPTION 'app role % is a member of the owner role', app_role;
    END IF;
    IF pg_has_role(app_role, (SELECT datdba FROM pg_database
                              WHERE datname = current_database()), 'MEMBER')
       OR pg_has_role(app_role, (SELECT nspowner FROM pg_namespace
                                 WHERE nspname = {_lit(schema)}), 'MEMBER')
       OR pg_has_role(app_role, (SELECT relowner FROM pg_class WHERE oid = events), 'MEMBER')
    THEN
        RAISE EXCEPTION 'app role % owns the database, the schema or the audit table', app_role;
    END IF;
    IF has_table_privilege(app_role, events, 'UPDATE') OR has_table_privilege(app_role, events, 'DELETE')
       OR has_table_privilege(app_role, events, 'TRUNCATE') OR has_table_privilege(app_role, events, 'TRIGGER')
       OR has_table_privilege(app_role, heads, 'DELETE') OR has_table_privilege(app_role, heads, 'TRUNCATE')
       OR has_table_privilege(app_role, heads, 'TRIGGER')
       OR has_table_privilege(app_role, registry, 'UPDATE') OR has_table_privilege(app_role, registry, 'DELETE')
       OR has_table_privilege(app_role, registry, 'TRUNCATE') OR has_table_privilege(app_role, registry, 'TRIGGER')
{tree_checks}    THEN
        RAISE EXCEPTION 'app role % may still change the audit trail (through PUBLIC or a role it belongs to)', app_role;
    END IF;
END $$""",
    ]




def role_setup_sql(*, owner: str, app: str, schema: str = "public") -> list[str]:
    """Both parts, in order (``role_bootstrap_sql`` then ``role_lockdown_sql``): the whole
    set-up of a database whose tables exist. Raises ``ValueError`` naming ``--owner`` or
    ``--app`` for a bad or equal role name."""
    return (role_bootstrap_sql(owner=owner, app=app, schema=schema)
            + role_lockdown_sql(owner=owner, app=app, schema=schema))


def missing_objects(cursor, schema: str = "public") -> list[str]:
    """What ``role_lockdown_sql`` needs that the database lacks (``migrate`` creates it):
    the names of the audit tables and trigger functions not found in ``schema``, in the
    order of the set-up; ``[]`` once migrated. ``cursor`` is a PostgreSQL cursor."""
    names = [f"{schema}.{m._meta.db_table}" for m in (AuditEvent, AuditChainHead, AuditTenant)]
    functions = [f"{schema}.{f}" for f in TRIGGER_FUNCTIONS]
    cursor.execute("SELECT " + ", ".join(["to_regclass(%s) IS NULL"] * len(names)
                                         + ["to_regprocedure(%s) IS NULL"] * len(functions)),
                   names + functions)
    return [name for name, gone in zip(names + functions, cursor.fetchone(), strict=True) if gone]


def role_setup_script(*, owner: str, app: str, schema: str = "public") -> str:
    """The two parts as two psql transactions (``--print``): part 1 at once, part 2 after
    ``migrate`` as the owner (its statements need the tables)."""
    part1 = ";\n\n".join(role_bootstrap_sql(owner=owner, app=app, schema=schema))
    part2 = ";\n\n".join(role_lockdown_sql(owner=owner, app=app, schema=schema))
    return (f"-- recovery: least-privilege roles (owner {owner}, app {app}); "
            "run as a superuser in the service's database\n"
            "-- Part 1: the roles, the schema, default privileges (any time, also on an "
            "empty database)\n"
            f"BEGIN;\n\n{part1};\n\nCOMMIT;\n\n"
            f"-- Part 2: after `python manage.py migrate` as {owner} (needs its tables):\n"
            "-- ownership, the audit trail's rights, the final check\n"
            f"BEGIN;\n\n{part2};\n\nCOMMIT;\n")


#: The paragraph every refusal of ``migrate`` ends with (the operator's walk, item 2).
MIGRATE_AS_OWNER = (
    "Migrations change the tables, and only their owner may: run migrate with the owner "
    "role's DATABASE_URL (not the service's app role), then `manage.py "
    "setup_database_roles --owner OWNER --app APP` as a superuser "
    "(docs/security/audit.md, database roles).")


def migrate_refusal(cursor, schema: str = "public", args: str = "") -> str | None:
    """Why the connected role cannot run ``migrate`` here, in one paragraph, or ``None``.

    ``None`` when every table of ``schema`` belongs to a role the connected role has the
    rights of (its own, a role it is a member of, or any for a superuser), and on an empty
    database. Otherwise names the connected role, a table and its owner, and what to do:
    with a non-superuser owner, migrate as that owner, then ``setup_database_roles``;
    with a superuser owner (a restore as the superuser, docs/operations/backup.md),
    ``setup_database_roles`` first. ``cursor`` is a PostgreSQL cursor; one query over
    ``pg_class``. Rule: the operator's walk, item 2 (``migrate`` as the app role was a
    raw ``must be owner of table`` traceback). ``args``: the arguments ``migrate`` was given
    (``"checkpoints 0049"``), repeated in the command the paragraph suggests.
    """
    cursor.execute(
        "SELECT current_user, current_database(), c.relname, r.rolname, r.rolsuper "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_roles r ON r.oid = c.relowner "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') "
        "AND NOT pg_has_role(current_user, c.relowner, 'USAGE') "
        "ORDER BY c.relname LIMIT 1", [schema])
    row = cursor.fetchone()
    if row is None:
        return None
    user, database, table, owner, owner_super = row
    if owner_super:
        return (f"migrate: connected as {user}, and the tables belong to {owner}, a "
                f"superuser (table {table}): a restore as the superuser, or a database set "
                f"up without the roles. First run `manage.py setup_database_roles --owner "
                f"OWNER --app APP` as a superuser, which gives the tables to the owner; "
                f"then migrate as the owner, then setup_database_roles again "
                f"(docs/operations/backup.md). Nothing was migrated.")
    return (f"migrate: connected as {user}, which does not own the tables (table {table} "
            f"belongs to {owner}). {MIGRATE_AS_OWNER} E.g. DATABASE_URL=postgres://"
            f"{owner}@HOST:PORT/{database} python manage.py migrate{' ' + args if args else ''}. "
            f"Nothing was migrated.")
