"""The demo's payment service (idempotency keys, status look-ups) and worker plan."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from checkpoints.demo.orchestrate import STRANDED, describe, plan, plan_langgraph
from checkpoints.demo.payments import PaymentService
from checkpoints.reconcile import EffectRef, HttpStatusReconciler


@pytest.fixture
def service(tmp_path):
    svc = PaymentService(tmp_path / "p.sqlite3").start()
    yield svc
    svc.stop()


def post(url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_it_charges_once_per_idempotency_key(service):
    body = {"order_id": "A-1", "amount_cents": 500}

    first = post(f"{service.url}/charges", body, key="charge:A-1")
    again = post(f"{service.url}/charges", body, key="charge:A-1")

    assert first[0] == 201 and again[0] == 200
    assert again[1]["charge_id"] == first[1]["charge_id"]
    assert len(service.store.charges("A-1")) == 1


def test_it_refuses_a_reused_key_with_another_body_and_a_missing_key(service):
    post(f"{service.url}/charges", {"order_id": "A-1", "amount_cents": 500}, key="k1")

    status, answer = post(f"{service.url}/charges", {"order_id": "A-1", "amount_cents": 9},
                          key="k1")
    missing = post(f"{service.url}/charges", {"order_id": "A-2", "amount_cents": 9})

    assert (status, answer["error"]) == (422, "idempotency_key_reuse")
    assert missing[0] == 400 and "Idempotency-Key" in missing[1]["detail"]
    assert len(service.store.charges()) == 1


def _ref(key: str) -> EffectRef:
    return EffectRef(tenant="acme", effect_id=uuid.uuid4(), service="payments",
                     operation_key=key, effect_class="non_idempotent",
                     request_fingerprint="0" * 64, attempt=1)


def test_it_answers_the_reconcilers_status_lookup(service):
    post(f"{service.url}/charges", {"order_id": "A-3", "amount_cents": 300}, key="charge:A-3")
    reconciler = HttpStatusReconciler(f"{service.url}/operations")

    found = reconciler.lookup(_ref("charge:A-3"))
    missing = reconciler.lookup(_ref("charge:never"))

    assert (found.kind, found.receipt["amount_cents"]) == ("found", 300)
    assert missing.kind == "not_executed"


def test_it_still_commits_a_charge_whose_client_died_while_it_was_held(service):
    """The slow provider: a client that gives up (or dies) before the answer changes
    nothing; the charge commits once, and a repeat with the key replays it."""
    service.store.hold_before_commit = gate = threading.Event()
    body = {"order_id": "A-4", "amount_cents": 400}
    req = urllib.request.Request(f"{service.url}/charges", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Idempotency-Key": "charge:A-4"}, method="POST")

    with pytest.raises(OSError):  # a timeout: the client goes away
        urllib.request.urlopen(req, timeout=0.3)
    assert service.store.received["charge:A-4"] == 1
    assert service.store.committed["charge:A-4"] == 0
    gate.set()
    deadline = time.monotonic() + 10
    while service.store.committed["charge:A-4"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    again = post(f"{service.url}/charges", body, key="charge:A-4")

    assert service.store.committed["charge:A-4"] == 1
    assert again[0] == 200
    assert service.store.executions("A-4") == 1


def test_it_plans_the_same_mix_for_the_same_seed():
    a, b = plan(36, seed=5), plan(36, seed=5)

    labels = [u.label for u in a]
    assert labels == [u.label for u in b]
    assert labels.count("race") == 4
    assert any(label.startswith("die ") for label in labels)
    assert sum(len(u.commands) for u in a) == 36


@pytest.mark.parametrize("seed", [1, 7, 1982])
def test_it_always_gives_the_first_tenant_the_readme_walk_through(seed):
    """Whatever the seed: one acme order killed at each boundary, one agent after its call,
    and one order stranded in v1 (killed after its in-flight checkpoint); every other
    order is written in the worker's default version, v2."""
    units = plan(36, seed=seed)
    kills = {(u.tenant, u.shape, u.label) for u in units}
    for boundary in ("after_intent", "after_submitted", "after_call", "after_confirmed"):
        assert ("acme", "order", f"die {boundary}") in kills
    assert ("acme", "agent", "die after_call") in kills
    stranded = [u for u in units if u.label == STRANDED]
    assert [(u.tenant, u.shape) for u in stranded] == [("acme", "order")]
    argv = stranded[0].commands[0]
    assert argv[argv.index("--schema-version") + 1] == "1"
    assert argv[argv.index("--die-at") + 1] == "after_intent"
    assert not any("--schema-version" in argv for u in units if u.label != STRANDED
                   for argv in [*u.commands, *([u.setup] if u.setup else [])])


@pytest.mark.parametrize("n", [2, 6, 12])
def test_it_plans_langgraph_runs_with_at_least_two_killed_in_the_tool(n):
    units = plan_langgraph(n, seed=3)

    assert [[*u.commands] for u in units] == [[*u.commands] for u in plan_langgraph(n, seed=3)]
    assert {u.module for u in units} == {"examples.langgraph_refund.run"}
    killed = [u for u in units if "--crash-in-tool" in u.commands[0]]
    assert len(killed) == max(2, n // 3)
    assert {(u.tenant, u.label) for u in killed} == {("acme", "die in_tool")}
    threads = [u.commands[0][u.commands[0].index("--thread-id") + 1] for u in units]
    assert len(set(threads)) == n


def test_it_names_an_example_killed_in_its_tool():
    args = ["--thread-id", "refund-LG-1", "--crash-in-tool"]

    assert describe(-9, '{"started": true}\n', "", args)["outcome"] == "killed in_tool"
    assert describe(0, '{"outcome": "completed"}\n', "", args[:2])["outcome"] == "completed"


@pytest.mark.django_db
def test_it_sets_the_demo_tenants_ambiguity_threshold_audited_and_admin_only(acme, adam, rita):
    from checkpoints import services
    from checkpoints.exceptions import Forbidden, InvalidPayload
    from checkpoints.models import AuditEvent

    services.tenant_set_ambiguity_threshold(actor=adam, tenant=acme, seconds=10)

    acme.refresh_from_db()
    assert acme.ambiguity_threshold_s == 10
    event = AuditEvent.objects.filter(tenant=acme, action="tenant.threshold").get()
    assert (event.actor_name, event.before, event.after) == (
        "adam", {"ambiguity_threshold_s": 300}, {"ambiguity_threshold_s": 10})
    with pytest.raises(Forbidden):
        services.tenant_set_ambiguity_threshold(actor=rita, tenant=acme, seconds=5)
    with pytest.raises(InvalidPayload, match="ambiguity_threshold_s"):
        services.tenant_set_ambiguity_threshold(actor=None, tenant=acme, seconds=0)


@pytest.mark.django_db
def test_the_demo_tenants_declare_the_order_id_as_a_subject_field():
    """(stop 36's newcomer) The demo's tenants declare ``order`` (``/order_id``) before
    any run is written, so a hold or an erasure request by an order id can be tried on
    the demo's runs; it was declared nowhere and every subject request matched nothing."""
    from checkpoints.management.commands.demo import DEMO_SUBJECT_FIELDS, TENANTS, Command
    from checkpoints.models import Tenant
    from checkpoints.services.lifecycle import policy_for

    Command()._create_tenants()
    for slug in TENANTS:
        policy = policy_for(Tenant.objects.get(slug=slug))
        assert policy.subject_fields == DEMO_SUBJECT_FIELDS == {
            "order": "/order_id", "thread": "/thread_id"}


def test_the_demo_langgraph_runs_are_found_by_a_declared_subject_field():
    """(a reviewer's finding) The LangGraph refund runs' payload is the
    ``langgraph.checkpoint`` summary (no channel value: no ``/order_id``), so no declared
    subject field resolved on them and a hold or an erasure request by value never found
    them. The demo declares ``thread`` (``/thread_id``): each run's thread is its order's
    (``refund-LG-2001``), indexed on every write of the run."""
    from checkpoints.interop.langgraph.common import _summary
    from checkpoints.management.commands.demo import DEMO_SUBJECT_FIELDS
    from checkpoints.services import subject_digest
    from checkpoints.services.lifecycle import subject_rows

    for unit in plan_langgraph(4, seed=7):
        args = unit.commands[0]
        thread, order = (args[args.index(flag) + 1] for flag in ("--thread-id", "--order-id"))
        assert thread == f"refund-{order}"
        summary = _summary(thread_id=thread, ns="", checkpoint_id="1ef", parent=None,
                           metadata={"step": 1, "source": "loop"}, nxt=["pay"], tasks=1,
                           written=0, interrupted=False, errored=False, identity={})
        rows = subject_rows(tenant=1, run_pk=1, payload=summary, fields=DEMO_SUBJECT_FIELDS)
        assert [(r.field, r.digest) for r in rows] == [
            ("thread", subject_digest(1, "thread", thread))]
