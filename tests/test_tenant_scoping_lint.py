"""Tenant scoping that cannot be forgotten (issue 7, item 4; docs/tenancy.md).

Parses ``checkpoints/`` with ``ast`` and fails, naming file:line, on a query of a
tenant-owned model that starts anywhere but ``Model.objects.for_tenant(...)``: a plain
``.objects.filter/get/all/create/select_for_update/...``, ``_default_manager`` or
``_base_manager``. A related manager (``run.effects.all()``) is allowed: its parent row was
read scoped, so it is scoped by construction. The escape hatch,
``Model.objects.for_all_tenants(reason=...)``, is allowed only where ``ESCAPE_HATCHES``
lists it, with why. ``.objects`` on a name that is not a known model (an alias such as
``model = Checkpoint if ... else Effect``) counts as a tenant model: the lint cannot tell.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent / "checkpoints"
SKIP = ("migrations/",)
TENANT_MODELS = sorted(m.__name__ for m in apps.get_app_config("checkpoints").get_models()
                       if any(f.name == "tenant" for f in m._meta.fields))
#: Models that belong to no tenant: ``.objects`` on them needs no scope.
UNSCOPED_MODELS = {"Tenant", "ApiToken", "User", "Group", "Permission", "ContentType"}
#: ``create``/``bulk_create`` write a row that names its tenant (``tenant`` is NOT NULL):
#: they read nothing, so they need no scope.
STARTS = {"for_tenant", "create", "bulk_create"}
HATCH = "for_all_tenants"
#: (file, function) -> why it spans tenants. Each ``for_all_tenants`` use must be here,
#: and each entry must still be used (a stale entry fails too).
ESCAPE_HATCHES = {
    ("audittree.py", "audit_integrate_all"):
        "the audit sequencer looks for every tenant with queued events (each is then "
        "integrated within its own tenant, under its own lease)",
    ("audittree.py", "integration_lag"):
        "/readyz and /metrics ask how long the oldest queued audit event of any tenant "
        "waits (a count and an age, never a tenant's rows)",
    ("audittree.py", "_lag"):
        "whether a queued event still exists: correlated with the queue row's own event "
        "id and tenant, so it reads that row's tenant only (an orphan row is no backlog)",
    ("services/notify_delivery.py", "claim_due"):
        "the notification sender claims every tenant's due messages (each then sent to "
        "its own tenant's endpoint)",
    ("services/notify_delivery.py", "record_attempt"):
        "the notification sender records the attempt of the message it claimed, by "
        "primary key",
    ("services/notify_delivery.py", "notify_health"):
        "/readyz asks whether any event or due message waits too long (a yes or no, never "
        "a tenant's rows)",
    ("metrics.py", "_bulk_job_figures"):
        "the operator's /metrics scrape counts every tenant's bulk jobs in aggregate "
        "(issue 22, item 6)",
    ("metrics.py", "_notification_figures"):
        "the operator's /metrics scrape counts every tenant's notification messages and "
        "endpoints in aggregate",
    ("services/notify_delivery.py", "disable_failing"):
        "the notification sender disables any tenant's endpoint failing for days (each "
        "then changed within its own tenant)",
    ("services/retention.py", "retention_purge_all"):
        "the scheduled retention purge visits every tenant with a data policy (each is "
        "then purged within its own tenant, under its own cleanup lease)",
    ("services/retention.py", "retention_health"):
        "/readyz asks whether any tenant's data policy deletes anything (a yes or no, "
        "never a tenant's rows)",
    ("services/counters.py", "counters_compact"):
        "the sweep's compaction looks for every tenant with too many state counter rows "
        "(each tenant's rows are then folded within its own tenant, under its own lock)",
    ("services/sweep.py", "sweep_stale_runs"):
        "the stale-run sweep looks at every tenant's runs (each run is then locked and "
        "changed within its own tenant)",
    ("services/keys.py", "payloads_rotate_keys"):
        "key rotation re-wraps every tenant's data keys (each row is rewritten within its "
        "own tenant)",
    ("services/keys.py", "_legacy_rows"):
        "key rotation reads every tenant's legacy ciphertexts (each row is rewritten "
        "within its own tenant; crypto-shredding asks for one tenant's only)",
    ("services/keys.py", "keyring_export"):
        "the keyring export lists every tenant's data keys (wrapped or destroyed) for the "
        "operator's backups",
    ("crypto.py", "_key"):
        "decrypt_text without a tenant (operator tools, tests) finds the data key by the "
        "id its ciphertext names; the service always passes the tenant",
    ("services/reconcile_requests.py", "redrive"):
        "the sweep re-drives every tenant's stale or due reconcile requests",
    ("services/reconcile_requests.py", "dispatch"):
        "marks, by primary key, the requests it was handed to the task queue (read scoped "
        "by the reviewer's action, or by the sweep's re-drive)",
    ("metrics.py", "domain_figures"):
        "the operator's /metrics scrape counts every tenant's rows in aggregate, per tenant "
        "(no row comes back; the endpoint needs RECOVERY_METRICS_TOKEN)",
    ("jobs/reconciliation.py", "_claim"):
        "a worker claims the request it was handed by primary key; everything it does next "
        "is scoped to that request's tenant",
    ("services/migration_jobs.py", "migration_jobs_redrive"):
        "the sweep re-drives every tenant's stale or due migration jobs",
    ("services/migration_jobs.py", "migration_job_dispatch"):
        "marks, by primary key, the migration jobs it was handed (created scoped by the "
        "admin's request, or found by the sweep's re-drive)",
    ("jobs/migrations.py", "_jobs"):
        "a worker claims, extends and finishes the migration job it was handed by primary "
        "key; the migration itself runs scoped to that job's tenant",
    ("services/bulk_jobs.py", "bulk_jobs_redrive"):
        "the sweep re-drives every tenant's stale or due bulk jobs (issue 22, item 6)",
    ("services/bulk_jobs.py", "bulk_job_dispatch"):
        "marks, by primary key, the bulk jobs it was handed (created scoped by the "
        "reviewer's request, or found by the sweep's re-drive)",
    ("jobs/bulk.py", "_jobs"):
        "a worker claims the bulk job it was handed by primary key; each run is then acted "
        "on scoped to that job's tenant",
    # The notification dispatcher (issue 21) works through every tenant's outbox; each
    # event goes to its own tenant's endpoints only (tests/services/test_notify_dispatch.py).
    ("services/notify_dispatch.py", "_claim"):
        "the dispatcher claims the next outbox rows of every tenant, oldest first",
    ("services/notify_dispatch.py", "_facts"):
        "the facts of the runs a claimed batch names (by primary key, from the outbox rows)",
    ("services/notify_dispatch.py", "_decisions"):
        "the latest retry request of the runs a claimed batch names (by primary key)",
    ("services/notify_dispatch.py", "_endpoints_of"):
        "the endpoints of the tenants a claimed batch names, each event matched within its "
        "own tenant",
    ("services/notify_dispatch.py", "_drop_unconfigured"):
        "deletes the outbox rows of every tenant with no endpoint (each row's own tenant's "
        "endpoints checked), unread",
    ("services/notify_dispatch.py", "_drain_batch"):
        "deletes, by primary key, the outbox rows the batch claimed",
    ("services/notify_dispatch.py", "write_runs"):
        "recounts, by primary key, the incidents the batch added runs to",
    ("services/notify_dispatch.py", "_flush_incidents"):
        "every tenant's incidents whose window ended; each message is its endpoint's tenant's",
    ("services/notify_dispatch.py", "_subscribed"):
        "the enabled endpoints of every tenant taking a type (aging, digest)",
    ("services/notify_dispatch.py", "_emit_aging"):
        "every subscribed tenant's runs still unknown too long, each told to its own tenant",
}
#: (file, function) -> why it may use a plain manager: it is handed a historical model
#: (a migration's ``apps.get_model``), whose manager has no ``for_tenant``.
HISTORICAL = {
    ("audit.py", "seal_legacy_chains"):
        "migration 0005 seals every tenant's legacy chain with its historical AuditChainHead",
    ("audit.py", "register_existing_tenants"):
        "migration 0017 registers every existing tenant with its historical Tenant and "
        "AuditTenant (neither is tenant-owned)",
    ("audit.py", "_register"):
        "appends to the tenant registry (AuditTenant, not tenant-owned), handed the model "
        "by tenant_register or by migration 0017",
}


def _enclosing_functions(tree: ast.AST) -> dict[int, str]:
    """line -> name of the innermost function around it."""
    where: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else name
            if hasattr(child, "lineno"):
                for line in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                    where[line] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return where


def scoping_problems(source: str, filename: str = "<snippet>") -> tuple[list[str], set]:
    """``(problems, hatches)``: ``file:line`` of each unscoped start of a tenant-model
    query, and the ``(file, function)`` of each ``for_all_tenants`` use."""
    tree = ast.parse(source, filename)
    functions = _enclosing_functions(tree)
    problems, hatches = [], set()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Call) and getattr(base.func, "id", "") == "get_user_model":
            continue  # accounts belong to no tenant
        model = base.id if isinstance(base, ast.Name) else (
            base.attr if isinstance(base, ast.Attribute) else "?")
        if model in UNSCOPED_MODELS:
            continue
        if node.attr in ("_default_manager", "_base_manager"):
            problems.append(f"{filename}:{node.lineno} {model}.{node.attr}")
            continue
        if node.attr != "objects":
            continue
        if model not in TENANT_MODELS and isinstance(base, ast.Name) and model[:1].isupper():
            continue  # some other app's model (a name we do not own)
        follow = parents.get(node)
        method = follow.attr if isinstance(follow, ast.Attribute) else ""
        if method in STARTS:
            continue
        if method == HATCH:
            hatches.add((filename, functions.get(node.lineno, "<module>")))
            continue
        if (filename, functions.get(node.lineno)) in HISTORICAL:
            continue
        problems.append(f"{filename}:{node.lineno} {model}.objects.{method or '?'}")
    return problems, hatches


def _scan():
    problems, hatches = [], set()
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(SKIP):
            continue
        found, used = scoping_problems(path.read_text(), rel)
        problems += found
        hatches |= used
    return problems, hatches


def test_every_query_on_tenant_data_starts_scoped():
    problems, _ = _scan()
    assert problems == [], ("start with Model.objects.for_tenant(tenant) (or a related "
                            "manager):\n" + "\n".join(problems))


def test_every_escape_hatch_is_listed_with_its_reason_and_still_used():
    _, hatches = _scan()
    assert hatches - set(ESCAPE_HATCHES) == set(), "unlisted for_all_tenants uses"
    assert set(ESCAPE_HATCHES) - hatches == set(), "listed but no longer used"


def test_the_tenant_models_are_the_ones_with_a_tenant():
    assert {"Run", "Checkpoint", "CheckpointRevision", "Effect", "EffectRevision", "Conflict",
            "RetryRequest", "AuditEvent", "AuditChainHead", "ReconcileRequest",
            "ReconcileAttempt", "ReconcilerConfig"} <= set(TENANT_MODELS)
    for name in TENANT_MODELS:
        assert hasattr(apps.get_model("checkpoints", name).objects, "for_tenant"), name


#: Where the tenant of a URL is resolved through the caller's grants: the dashboard's
#: ``tenant_page`` decorator and the API's ``TenantApi.initial``. A view that resolved it
#: by itself could skip the base.
RESOLVERS = {("dashboard/common.py", "wrapper"), ("api/views/common.py", "initial")}
#: The dashboard's modules (``checkpoints/dashboard/``, one per page) and the API's
#: (``checkpoints/api/views/``, one per resource), relative to ROOT.
DASHBOARD = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dashboard").glob("*.py"))
API_VIEWS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "api/views").glob("*.py"))


def test_views_get_their_tenant_only_from_the_base():
    # The walk reads the packages' page and resource modules, not an empty glob.
    assert {"dashboard/inbox.py", "dashboard/run.py"} <= set(DASHBOARD)
    assert {"api/views/runs.py", "api/views/common.py"} <= set(API_VIEWS)
    calls = set()
    for rel in (*DASHBOARD, *API_VIEWS):
        tree = ast.parse((ROOT / rel).read_text(), rel)
        functions = _enclosing_functions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "access_tenant":
                calls.add((rel, functions.get(node.lineno)))
    assert calls == RESOLVERS


def test_every_dashboard_view_with_a_tenant_wears_tenant_page():
    """A view whose URL has a ``slug`` takes ``tenant`` (the decorator's), never the slug."""
    nodes = [node for rel in DASHBOARD for node in ast.parse((ROOT / rel).read_text()).body]
    for node in nodes:
        if isinstance(node, ast.FunctionDef) and node.args.args[:1] \
                and node.args.args[0].arg == "request":
            names = [a.arg for a in node.args.args]
            assert "slug" not in names, node.name
            if "tenant" in names and not node.name.startswith("_"):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                assert any(d.startswith("tenant_page") for d in decorators), node.name


@pytest.mark.parametrize("snippet", [
    "Effect.objects.filter(state='x')",
    "Run.objects.get(pk=1)",
    "Run.objects.select_for_update().filter(tenant=t)",
    "list(AuditEvent.objects.all())",
    "Conflict.objects.get_or_create(tenant=t)",
    "RetryRequest._default_manager.filter(pk=1)",
    "model = Checkpoint if a else Effect\nmodel.objects.filter(uuid=u)",
])
def test_the_lint_finds_an_unscoped_query(snippet):
    problems, _ = scoping_problems(snippet)
    assert len(problems) == 1, problems
    assert problems[0].startswith("<snippet>:")


def test_the_lint_accepts_scoped_starts_related_managers_and_reports_hatches():
    problems, hatches = scoping_problems(
        "def f(t, run):\n"
        "    Effect.objects.for_tenant(t).filter(state='x')\n"
        "    run.effects.filter(state='x')\n"
        "    Tenant.objects.get(slug='a')\n"
        "def g():\n"
        "    Run.objects.for_all_tenants(reason='sweep').filter(x=1)\n")
    assert problems == [] and hatches == {("<snippet>", "g")}
