"""Access helpers: scope by tenant first (outside -> 404), then by role (lacking -> 403).

Every view, API endpoint and service asks here; django-guardian's tables are read only
here and in ``selectors``. A tenant the account has no role in, and everything in it, is
answered exactly as if it did not exist (CONTRACT.md section 3).

Cost (issue 8): the rights of a request's caller in the URL's tenant are read once, with
the tenant row, in one query (``access_tenant``), and kept on the user object for the
rest of the request (``tenant_perms``); the user object lives for one request. Work
that outlives a request and checks again (a stored bulk job, before each batch) reads
the account anew for each check (``account_now``).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from guardian.models import GroupObjectPermission

from . import roles
from .exceptions import Forbidden, NotFound
from .models import Tenant
from .vocab import Role

_CACHE = "_tenant_perms_cache"
#: Every right a role can carry: the only codenames ``tenant_perms`` answers.
_RIGHTS = roles.ROLE_PERMISSIONS[Role.ADMIN]
_SQL: dict[str, str] = {}


def _rights_sql(key: str) -> str:
    """The one statement that reads a tenant (``WHERE <key> = %s``) and the codenames the
    user's groups hold on it: one row per codename, or one row with a NULL codename (no
    right), or no row (no such tenant). Parameters: user id, content type id (twice),
    the key's value.

    It reads exactly what guardian's ``ObjectPermissionChecker(user).get_group_perms
    (tenant)`` reads: the generic ``GroupObjectPermission`` rows of the user's groups
    for the tenant's content type and primary key (as text), of permissions of that
    content type. Written as SQL, with every name taken from the models, because the ORM
    spends more time building the query than the database answering it (issue 8)."""
    if key not in _SQL:
        q = connection.ops.quote_name
        t, gop, perm = Tenant._meta, GroupObjectPermission._meta, Permission._meta
        member = get_user_model().groups.through._meta

        def col(meta, name):
            return q(meta.get_field(name).column)

        columns = ", ".join(f"t.{q(f.column)}" for f in t.concrete_fields)
        _SQL[key] = (
            f"SELECT {columns}, r.{col(perm, 'codename')} AS codename "
            f"FROM {q(t.db_table)} t LEFT JOIN ("
            f"SELECT g.{col(gop, 'object_pk')} AS object_pk, p.{col(perm, 'codename')} "
            f"FROM {q(gop.db_table)} g "
            f"JOIN {q(member.db_table)} m ON m.{col(member, 'group')} = g.{col(gop, 'group')}"
            f" AND m.{col(member, 'user')} = %s "
            f"JOIN {q(perm.db_table)} p ON p.{col(perm, 'id')} = g.{col(gop, 'permission')}"
            f" AND p.{col(perm, 'content_type')} = %s "
            f"WHERE g.{col(gop, 'content_type')} = %s"
            f") r ON r.object_pk = CAST(t.{col(t, 'id')} AS VARCHAR(255)) "
            f"WHERE t.{col(t, key)} = %s")
    return _SQL[key]


#: Prefix of the tenant's columns in ``scope_join``'s select list.
SCOPE_PREFIX = "scope_t_"
_SCOPE = "_tenant_scope_read"


def scope_join(user_id: str) -> tuple[str, str]:
    """The parts that add "the tenant of a slug and the caller's rights in it" to a query
    that already reads the caller (issue 22, item 3: the bearer token's look-up reads
    them in the same statement, one round trip instead of two): ``(columns, joins)``,
    ``columns`` the tenant's columns (each named ``SCOPE_PREFIX`` + column) and the
    right's ``codename``, ``joins`` two ``LEFT JOIN``s to append after the caller's table,
    whose ``id`` column is the SQL expression ``user_id``. Parameters, in the order the
    joins use them: the slug, then the tenant content type id twice.

    The rows are ``_rights_sql``'s (one per codename held, one with a NULL codename for
    none, the tenant's columns NULL for no such tenant), read from the same tables with
    the same conditions; ``scope_rows`` turns them into ``_read``'s answer."""
    q = connection.ops.quote_name
    t, gop, perm = Tenant._meta, GroupObjectPermission._meta, Permission._meta
    member = get_user_model().groups.through._meta

    def col(meta, name):
        return q(meta.get_field(name).column)

    columns = ", ".join(f"st.{q(f.column)} AS {q(SCOPE_PREFIX + f.column)}"
                        for f in t.concrete_fields)
    joins = (
        f"LEFT JOIN {q(t.db_table)} st ON st.{col(t, 'slug')} = %s "
        f"LEFT JOIN ("
        f"SELECT m.{col(member, 'user')} AS user_id, g.{col(gop, 'object_pk')} AS object_pk, "
        f"p.{col(perm, 'codename')} "
        f"FROM {q(gop.db_table)} g "
        f"JOIN {q(member.db_table)} m ON m.{col(member, 'group')} = g.{col(gop, 'group')} "
        f"JOIN {q(perm.db_table)} p ON p.{col(perm, 'id')} = g.{col(gop, 'permission')}"
        f" AND p.{col(perm, 'content_type')} = %s "
        f"WHERE g.{col(gop, 'content_type')} = %s"
        f") sr ON sr.user_id = {user_id} AND sr.object_pk = CAST(st.{col(t, 'id')} AS VARCHAR(255))")
    return f"{columns}, sr.{col(perm, 'codename')} AS scope_codename", joins


def scope_params(slug: str) -> list:
    """``scope_join``'s parameters for ``slug``."""
    tenant_type = ContentType.objects.get_for_model(Tenant).pk  # cached per process
    return [slug, tenant_type, tenant_type]


def scope_rows(user, slug: str, rows: list) -> None:
    """Keep on ``user`` (the request's caller, whose object lives for one request) what
    ``scope_join`` read for ``slug`` in ``rows`` (model instances of a raw query carrying
    its columns as attributes), so that ``access_tenant(user, slug)`` answers from it
    instead of reading again: exactly ``_read(user, "slug", slug)``'s answer, read in the
    same request. The attributes are removed from the rows."""
    tenant = None
    names = [f.attname for f in Tenant._meta.concrete_fields]
    first = rows[0]
    values = [getattr(first, SCOPE_PREFIX + f.column) for f in Tenant._meta.concrete_fields]
    if values[names.index("id")] is not None:
        db = first._state.db or "default"
        converted = []
        for f, v in zip(Tenant._meta.concrete_fields, values, strict=True):
            col = f.get_col(Tenant._meta.db_table)
            for conv in (*connection.ops.get_db_converters(col), *f.get_db_converters(connection)):
                v = conv(v, col, connection)
            converted.append(v)
        tenant = Tenant.from_db(db, names, converted)
    perms = frozenset(r.scope_codename for r in rows if r.scope_codename in _RIGHTS)
    for r in rows:
        for f in Tenant._meta.concrete_fields:
            r.__dict__.pop(SCOPE_PREFIX + f.column, None)
        r.__dict__.pop("scope_codename", None)
    user.__dict__[_SCOPE] = (slug, tenant, perms if tenant is not None else frozenset())


def _read(user, key: str, value) -> tuple[Tenant | None, frozenset]:
    """The tenant whose ``key`` is ``value`` (``None`` if none) and ``user``'s rights in
    it (codenames of ``_RIGHTS``), in one query (``_rights_sql``)."""
    tenant_type = ContentType.objects.get_for_model(Tenant).pk  # cached per process
    rows = list(Tenant.objects.raw(_rights_sql(key), [user.pk, tenant_type, tenant_type, value]))
    if not rows:
        return None, frozenset()
    return rows[0], frozenset(row.codename for row in rows if row.codename in _RIGHTS)


def _has_no_rights(user) -> bool:
    return user is None or not user.is_authenticated or not user.is_active


def tenant_perms(user: AbstractBaseUser | AnonymousUser | None, tenant: Tenant) -> set[str]:
    """The codenames (``roles.VIEW`` ...) ``user`` holds on ``tenant`` through its role
    groups, as a new set; empty for ``None``, anonymous and inactive accounts.

    Rights come only from the tenant's role groups (CONTRACT.md 4): the superuser and
    staff flags, global permissions and object permissions given to the account itself
    all count for nothing. (guardian's ``ObjectPermissionChecker.get_perms`` hands a
    superuser every permission, so only the group permissions are read, as its
    ``get_group_perms`` does; issue 6, fault 1. ``tests/test_roles.py`` checks that the
    answer is guardian's.) One query when not known yet for this user object.
    """
    if _has_no_rights(user):
        return set()
    # Cached on the user object, which lives for one request (or one command): the view
    # and the service it calls ask the same question. ``forget_perms`` clears it (the
    # services granting and revoking roles call it).
    cache = user.__dict__.setdefault(_CACHE, {})
    if tenant.pk not in cache:
        cache[tenant.pk] = _read(user, "id", tenant.pk)[1]
    return set(cache[tenant.pk])


def forget_perms(user) -> None:
    """Drop the per-request cache of ``tenant_perms`` on this user object, so the next
    question is answered from the database (after a grant, a revocation or a
    deactivation made through this same object)."""
    if user is not None:
        user.__dict__.pop(_CACHE, None)


def account_now(user):
    """A new object of ``user``'s account, read from the database now (``is_active`` as it
    is now), on which no rights are known yet: ``tenant_perms`` on it reads the tenant
    grants as they are now, once, and keeps them on that new object. ``None`` when the
    account no longer exists.

    For a holder that outlives a request (a stored bulk job's worker, before each batch:
    ``jobs.bulk``): the rights kept on a user object (``tenant_perms``) and its
    ``is_active`` are those of the moment it was read, right for one request only, and a
    revocation or a deactivation made through another object of the same account
    (``services.role_revoke``, ``account_deactivate``) does not clear them."""
    return get_user_model()._default_manager.filter(pk=user.pk).first()


def receipts_in_answers(user, tenant: Tenant) -> bool:
    """Whether API answers about effects may carry their receipts to ``user`` unaudited.

    Only for a runtime: a role that writes (``write_runs``) and may not reveal. A runtime
    needs the receipt of a ``confirmed`` effect to replay it instead of calling the
    service again. Viewers never see a receipt; reviewers, approvers and admins see one
    only through an audited reveal with a reason (``services.receipt_reveal``), as for
    payloads (CONTRACT.md 4: "effect receipts are treated like payloads"; issue 6,
    fault 3). So an admin, who may reveal, is answered like a reviewer.
    """
    perms = tenant_perms(user, tenant)
    return roles.WRITE in perms and roles.REVEAL not in perms


def access_tenant(user, slug: str, codename: str = roles.VIEW) -> Tenant:
    """The tenant ``slug`` if ``user`` has a role in it and holds ``codename``; one query,
    which also reads the user's rights there (kept for ``tenant_perms``).

    Raises ``NotFound`` when the tenant does not exist or the user has no role there,
    ``Forbidden`` when a role is held but lacks ``codename``.
    """
    if len(slug) > Tenant._meta.get_field("slug").max_length:  # checked before any query
        raise NotFound("no such tenant")
    if _has_no_rights(user):
        tenant = Tenant.objects.filter(slug=slug).first()
    else:  # the tenant and the caller's rights in it: one query (issue 8), or none when
        # the token's look-up read them already (``scope_rows``, issue 22)
        read = user.__dict__.pop(_SCOPE, None)
        if read is not None and read[0] == slug:
            tenant, perms = read[1], read[2]
        else:
            tenant, perms = _read(user, "slug", slug)
        if tenant is not None:
            user.__dict__.setdefault(_CACHE, {})[tenant.pk] = perms
    if tenant is None:
        raise NotFound(f"no tenant {slug!r}")
    perms = tenant_perms(user, tenant)
    if roles.VIEW not in perms:
        raise NotFound(f"no tenant {slug!r}")
    if codename not in perms:
        raise Forbidden(f"your role in {slug} does not allow this")
    return tenant


def require(user, tenant: Tenant, codename: str) -> None:
    """Raise ``NotFound`` (no role) or ``Forbidden`` (role lacks ``codename``)."""
    perms = tenant_perms(user, tenant)
    if roles.VIEW not in perms:
        raise NotFound("not found")
    if codename not in perms:
        raise Forbidden(f"your role in {tenant.slug} does not allow this")


def role_names(user, tenant: Tenant) -> list[str]:
    """Names of the roles ``user`` holds in ``tenant``, from its group memberships."""
    if user is None or not user.is_authenticated:
        return []
    prefix = roles.group_name(tenant.slug, "")
    return sorted(
        g[len(prefix):] for g in user.groups.filter(name__startswith=prefix)
        .values_list("name", flat=True)
    )
