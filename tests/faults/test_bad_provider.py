"""Issue 5, fault 4: bad data from a provider, and plugins that raise, hang or return
garbage (CONTRACT.md 6, last paragraph: "a bad answer is recorded, never a crash").

Each bad answer is stored as ``cannot_tell`` with the reason; the effect does not move;
the request retries with its failures counted and, after the cap, gives up with the error
shown in the run's API detail (``reconcile_requests``). One effect's bad answer never
skips its siblings.
"""

from __future__ import annotations

import json

import pytest

from checkpoints import reconcile, services
from checkpoints.jobs import reconciliation
from checkpoints.models import AuditEvent, Effect, EffectRevision, ReconcileRequest
from tests.api.apihelpers import get, post
from tests.faults import stubs
from tests.faults.conftest import in_doubt_run, request_for
from tests.helpers import age_world

CAP = 3
GOOD = b'{"status": "succeeded", "charge_id": "ch_7", "amount_cents": 2599}'


def _deep(n: int) -> bytes:
    return b'{"status": "succeeded", "x": ' + b"[" * n + b"]" * n + b"}"


# (id, body the provider answers with 200, words the stored reason must contain)
BAD_BODIES = [
    ("nul_in_string", b'{"status": "succeeded", "note": "a\\u0000b"}', "U+0000"),
    ("nul_in_key", b'{"status": "succeeded", "a\\u0000": 1}', "U+0000"),
    ("nan", b'{"status": "succeeded", "amount": NaN}', "NaN"),
    ("infinity", b'{"status": "succeeded", "amount": -Infinity}', "Infinity"),
    ("overflow_1e400", b'{"status": "succeeded", "amount": 1e400}', "amount"),
    ("lone_surrogate", b'{"status": "succeeded", "note": "\\ud800"}', "surrogate"),
    ("lone_surrogate_key", b'{"status": "succeeded", "\\udfff": 1}', "surrogate"),
    ("nested_5000_deep", _deep(5000), "nesting"),
    ("two_megabytes", b'{"status": "succeeded", "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}',
     "larger than"),
    ("not_an_object", b'["succeeded"]', "object"),
    ("a_bare_string", b'"succeeded"', "object"),
    ("huge_status_string", json.dumps({"status": "s" * 200_000}).encode(), "unexpected status"),
    ("status_not_a_string", b'{"status": {"nested": true}}', "unexpected status"),
    ("duplicated_key", b'{"status": "failed", "status": "succeeded"}', "duplicated"),
    ("not_utf8", b'{"status": "succeeded", "note": "\xff\xfe"}', "UTF-8"),
    ("malformed", b'{"status": "succeeded",', "malformed"),
    ("empty_object", b"{}", "unexpected status"),
]


@pytest.fixture
def cap(settings):
    settings.RECOVERY_RECONCILE_MAX_FAILURES = CAP
    return CAP


def _run_until_done(pk: int) -> list[str]:
    """Execute the request whenever it is due (aging the world past each back-off)."""
    results = []
    for _ in range(CAP + 2):
        result = reconciliation.execute(pk)["result"]
        results.append(result)
        if result not in ("retry", "skipped", "waiting"):
            break
        age_world(3600)
    return results


def _assert_untouched(effect_id, revision: int, state: str) -> None:
    effect = Effect.objects.get(uuid=effect_id)
    assert (effect.state, effect.revision, effect.receipt) == (state, revision, None)


@pytest.mark.parametrize("body,words", [b[1:] for b in BAD_BODIES],
                         ids=[b[0] for b in BAD_BODIES])
def test_a_bad_answer_is_cannot_tell_retried_then_given_up_with_the_error_shown(
        acme, wendy, rita, api_as, stub, cap, body, words,
        django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme)
    stub.answer("charge:A-1", body)
    age_world(3600)  # the owner is long gone and the settle delay has passed
    with django_capture_on_commit_callbacks(execute=True):
        r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "died"})
    assert r.status_code == 202, r.content
    req = request_for(run.effects["charge:A-1"])
    req.refresh_from_db()
    assert (req.state, req.attempts, req.failures) == ("queued", 1, 1)  # retrying
    assert words in req.last_error
    _assert_untouched(run.effects["charge:A-1"], 1, "submitted")

    age_world(3600)
    assert _run_until_done(req.pk) == ["retry", "gave_up"]

    req.refresh_from_db()
    assert (req.state, req.attempts, req.failures, req.outcome) == ("gave_up", CAP, CAP, "")
    answers = list(req.attempt_log.values_list("answer", "applied"))
    assert answers == [("cannot_tell", "")] * CAP
    assert all(words in a.detail for a in req.attempt_log.all())
    _assert_untouched(run.effects["charge:A-1"], 1, "submitted")
    assert not AuditEvent.objects.filter(action="effect.reconcile").exists()
    gave_up = AuditEvent.objects.get(action="reconcile.gave_up")
    assert words in gave_up.reason
    shown = get(api_as(rita), "acme", f"runs/{run.run_id}").json()["reconcile_requests"]
    assert [(q["state"], q["failures"]) for q in shown] == [("gave_up", CAP)]
    assert words in shown[0]["last_error"]
    assert [a["answer"] for a in shown[0]["attempt_log"]] == ["cannot_tell"] * CAP
    # A given-up request is not driven again; the effect waits for a human.
    age_world(3600)
    services.sweep_stale_runs()
    req.refresh_from_db()
    assert (req.state, req.attempts) == ("gave_up", CAP)
    assert services.audit_verify(tenant=acme)[0]


def test_a_bad_answer_for_one_effect_never_skips_its_sibling(
        acme, wendy, rita, api_as, stub, django_capture_on_commit_callbacks):
    run = in_doubt_run(wendy, acme, keys=("charge:bad", "charge:good"))
    stub.answer("charge:bad", _deep(5000))
    stub.answer("charge:good", GOOD)
    age_world(3600)
    with django_capture_on_commit_callbacks(execute=True):
        r = post(api_as(rita), "acme", f"runs/{run.run_id}/reconcile", {"reason": "died"})
    assert r.status_code == 202, r.content
    good = Effect.objects.get(uuid=run.effects["charge:good"])
    assert good.state == "confirmed" and good.receipt["charge_id"] == "ch_7"
    _assert_untouched(run.effects["charge:bad"], 1, "submitted")
    assert request_for(run.effects["charge:bad"]).failures == 1


# --------------------------------------------------------------------------------------
# Plugins that misbehave
# --------------------------------------------------------------------------------------

def _reconcile_crm(acme, wendy, rita, capture) -> tuple:
    """A run with a ``crm`` effect (the misbehaving plugin) and a ``payments`` one (the
    stub, which knows the charge); both reconciled in one action."""
    run = in_doubt_run(wendy, acme, keys=("note:1",), service="crm")
    sibling = in_doubt_run(wendy, acme, keys=("charge:A-1",))
    age_world(3600)
    with capture(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run.run_id, reason="died")
        services.run_reconcile(actor=rita, tenant=acme, run_id=sibling.run_id, reason="died")
    return run, sibling


def test_a_plugin_that_raises_is_cannot_tell_with_its_message(
        acme, wendy, rita, stub, django_capture_on_commit_callbacks):
    stubs.use_plugin(acme, "crm", "tests.faults.stubs.RaisingPlugin")
    stub.answer("charge:A-1", GOOD)
    run, sibling = _reconcile_crm(acme, wendy, rita, django_capture_on_commit_callbacks)
    req = request_for(run.effects["note:1"])
    assert (req.state, req.failures) == ("queued", 1)
    attempt = req.attempt_log.get()
    assert attempt.answer == "cannot_tell"
    assert "RuntimeError: provider SDK exploded" in attempt.detail
    assert "\x00" not in attempt.detail and len(attempt.detail) <= 1000
    _assert_untouched(run.effects["note:1"], 1, "submitted")
    assert Effect.objects.get(uuid=sibling.effects["charge:A-1"]).state == "confirmed"


def test_a_plugin_that_hangs_past_its_timeout_is_cannot_tell(
        acme, wendy, rita, stub, hang_released, django_capture_on_commit_callbacks):
    stubs.use_plugin(acme, "crm", "tests.faults.stubs.HangingPlugin", timeout_s=1)
    stub.answer("charge:A-1", GOOD)
    run, sibling = _reconcile_crm(acme, wendy, rita, django_capture_on_commit_callbacks)
    req = request_for(run.effects["note:1"])
    assert (req.state, req.failures) == ("queued", 1)
    assert "no answer within 1 s" in req.attempt_log.get().detail
    _assert_untouched(run.effects["note:1"], 1, "submitted")
    assert Effect.objects.get(uuid=sibling.effects["charge:A-1"]).state == "confirmed"
    # The late answer of the hung call is never applied.
    hang_released.set()
    assert Effect.objects.get(uuid=run.effects["note:1"]).state == "submitted"


def _garbage_answered(acme, wendy, rita, stub, garbage, monkeypatch, capture):
    """Reconcile a run whose CRM plugin answers ``stubs.GARBAGE[garbage]`` (a sibling's
    payment look-up answers well): ``(run, sibling, the one attempt)``, the request
    queued again after one failure."""
    monkeypatch.setitem(stubs.GARBAGE_CHOICE, "value", garbage)
    stubs.use_plugin(acme, "crm", "tests.faults.stubs.GarbagePlugin")
    stub.answer("charge:A-1", GOOD)
    run, sibling = _reconcile_crm(acme, wendy, rita, capture)
    req = request_for(run.effects["note:1"])
    assert (req.state, req.failures) == ("queued", 1)
    return run, sibling, req.attempt_log.get()


@pytest.mark.parametrize("garbage", sorted(stubs.GARBAGE))
def test_a_plugin_that_returns_garbage_is_cannot_tell_and_never_a_crash(
        acme, wendy, rita, stub, garbage, monkeypatch, django_capture_on_commit_callbacks):
    run, sibling, attempt = _garbage_answered(acme, wendy, rita, stub, garbage, monkeypatch,
                                              django_capture_on_commit_callbacks)
    assert attempt.answer == "cannot_tell" and attempt.detail
    assert "\x00" not in attempt.detail
    _assert_untouched(run.effects["note:1"], 1, "submitted")
    assert not EffectRevision.objects.filter(effect__uuid=run.effects["note:1"],
                                             source="reconciliation").exists()
    assert Effect.objects.get(uuid=sibling.effects["charge:A-1"]).state == "confirmed"
    assert ReconcileRequest.objects.filter(state="running").count() == 0


@pytest.mark.parametrize("garbage", ["evidence_huge", "found_evidence_huge"])
def test_a_plugin_s_evidence_over_the_answer_cap_is_cannot_tell_and_never_stored(
        acme, wendy, rita, stub, garbage, monkeypatch, django_capture_on_commit_callbacks):
    """Evidence is kept with the attempt, so it has the cap of a service's answer
    (``reconcile.MAX_ANSWER_BYTES``): five MiB of it, with a cannot_tell or with a small
    receipt, is refused like any bad answer and none of it is stored."""
    run, sibling, attempt = _garbage_answered(acme, wendy, rita, stub, garbage, monkeypatch,
                                              django_capture_on_commit_callbacks)
    assert attempt.answer == "cannot_tell"
    assert f"evidence larger than {reconcile.MAX_ANSWER_BYTES} bytes" in attempt.detail
    assert attempt.evidence_ciphertext == ""
    _assert_untouched(run.effects["note:1"], 1, "submitted")
    assert Effect.objects.get(uuid=sibling.effects["charge:A-1"]).state == "confirmed"


def test_a_plugin_s_evidence_at_the_answer_cap_is_kept(
        acme, wendy, rita, stub, monkeypatch, django_capture_on_commit_callbacks):
    """The cap counts the evidence as stored (its canonical JSON text in UTF-8): exactly
    ``reconcile.MAX_ANSWER_BYTES`` bytes of it is kept."""
    pad = reconcile.MAX_ANSWER_BYTES - len('{"blob":""}')
    monkeypatch.setitem(stubs.GARBAGE, "at_the_cap", lambda: reconcile.Answer.cannot_tell(
        "hm", evidence={"blob": "a" * pad}))
    monkeypatch.setitem(stubs.GARBAGE_CHOICE, "value", "at_the_cap")
    stubs.use_plugin(acme, "crm", "tests.faults.stubs.GarbagePlugin")
    stub.answer("charge:A-1", GOOD)
    run, _ = _reconcile_crm(acme, wendy, rita, django_capture_on_commit_callbacks)
    attempt = request_for(run.effects["note:1"]).attempt_log.get()
    assert (attempt.answer, attempt.detail) == ("cannot_tell", "hm")
    assert attempt.evidence_ciphertext


def test_a_plugin_s_detail_is_stored_as_one_printable_line(
        acme, wendy, rita, stub, monkeypatch, django_capture_on_commit_callbacks):
    """(stop 33, the attack's doubt) A plugin's free-text detail is shown on the run page
    and in the audit trail, where people's reasons may hold no ESC sequence or direction
    override (``printable_problem``): it is stored with every control and bidirectional
    character escaped (``jsonparse.shown``), the rest as written."""
    monkeypatch.setitem(stubs.GARBAGE, "hostile_detail", lambda: reconcile.Answer.cannot_tell(
        "gateway said \x1b[2Jnothing\nto\u202ereport é"))
    monkeypatch.setitem(stubs.GARBAGE_CHOICE, "value", "hostile_detail")
    stubs.use_plugin(acme, "crm", "tests.faults.stubs.GarbagePlugin")
    stub.answer("charge:A-1", GOOD)
    run, _ = _reconcile_crm(acme, wendy, rita, django_capture_on_commit_callbacks)
    attempt = request_for(run.effects["note:1"]).attempt_log.get()
    assert attempt.detail == "gateway said \\x1b[2Jnothing\\nto\\u202ereport é"
