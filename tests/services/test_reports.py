"""The report over time (issue 9, item 6): the run history the triggers of migration 0013
keep (every write path, both databases), the figures read from it and the other tables,
the range rules, the CSV cells, the cost in queries and the resume record.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import transaction

from checkpoints import reports, services
from checkpoints.dbclock import db_now
from checkpoints.exceptions import InvalidPayload, NotFound, StaleRevision
from checkpoints.models import CheckpointRevision, ResumeDecision, Run, RunTransition, Tenant
from checkpoints.services.runs import _drop_if_empty, _lock_run
from checkpoints.vocab import RecoveryState, ResumeAction
from tests.helpers import (
    ambiguous_run,
    effect_body,
    envelope,
    put_checkpoint,
    sweep_later,
    walk_effect,
)

S = RecoveryState


def chains(tenant) -> dict[int, list[tuple[str, str]]]:
    out: dict[int, list[tuple[str, str]]] = {}
    for run_id, a, b in (RunTransition.objects.for_tenant(tenant).order_by("at", "id")
                         .values_list("run_id", "from_state", "to_state")):
        out.setdefault(run_id, []).append((a, b))
    return out


def assert_history_true(*tenants):
    """Every run's transitions form one chain from its creation ('' -> first state) to
    its current ``recovery_state``, and no transition is left without its run."""
    for tenant in tenants:
        runs = dict(Run.objects.for_tenant(tenant).values_list("id", "recovery_state"))
        history = chains(tenant)
        assert set(history) == set(runs), tenant.slug
        for run_id, steps in history.items():
            assert steps[0][0] == "", steps
            for (_, to), (frm, _) in zip(steps, steps[1:], strict=False):
                assert frm == to, steps
            assert all(a != b for a, b in steps), steps
            assert steps[-1][1] == runs[run_id], steps


@pytest.mark.django_db
def test_the_triggers_record_every_state_change(acme, globex, wendy, wes, rita):
    healthy = envelope()
    put_checkpoint(wendy, acme, healthy)                      # run insert
    put_checkpoint(wes, globex, envelope())
    put_checkpoint(wendy, acme, dict(healthy, revision=1,
                                     payload={"phase": "completed", "order_id": "A-1"}), expected=0)
    run_id = ambiguous_run(wendy, acme)                       # swept: ambiguous
    walk_effect(wendy, acme, effect_body(run_id=uuid.uuid4()), "submitted")
    sweep_later()
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="handled")
    with pytest.raises(StaleRevision):                        # a conflict: -> conflicted
        put_checkpoint(wendy, acme, dict(healthy, revision=1), expected=0)
    assert_history_true(acme, globex)
    steps = chains(acme)[Run.objects.for_tenant(acme).get(uuid=run_id).pk]
    assert steps == [("", S.HEALTHY), (S.HEALTHY, S.AMBIGUOUS), (S.AMBIGUOUS, S.CLOSED)]
    first = chains(acme)[Run.objects.for_tenant(acme).get(uuid=healthy["run_id"]).pk]
    assert first == [("", S.HEALTHY), (S.HEALTHY, S.COMPLETED), (S.COMPLETED, S.CONFLICTED)]
    # ... at the database's clock
    latest = RunTransition.objects.for_tenant(acme).order_by("-at").first().at
    assert abs((db_now() - latest).total_seconds()) < 60


@pytest.mark.django_db
def test_a_deleted_run_and_a_rolled_back_write_leave_no_history(acme, wendy):
    put_checkpoint(wendy, acme, envelope())
    with transaction.atomic():
        run = _lock_run(acme, uuid.uuid4(), create=True)     # the loser of a create race
        _drop_if_empty(run)
    with pytest.raises(RuntimeError), transaction.atomic():
        put_checkpoint(wendy, acme, envelope())
        raise RuntimeError("the write's transaction rolls back")
    assert_history_true(acme)
    assert RunTransition.objects.for_tenant(acme).count() == 1


@pytest.mark.django_db
def test_generated_load_has_a_history(db):
    call_command("generate_load", tenants=2, runs=40, revisions=80, seed=3, verbosity=0)
    tenants = list(Tenant.objects.filter(slug__startswith="load-"))
    assert tenants
    assert_history_true(*tenants)


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_sql_write_path_records_its_state_changes(acme, wendy, settings, monkeypatch):
    from checkpoints.services import writepath

    settings.RECOVERY_SQL_WRITE_PATH = True
    taken = []
    real = writepath.checkpoint_update

    def spy(*args, **kwargs):
        answer = real(*args, **kwargs)
        taken.append(answer is not writepath.FALLBACK)
        return answer

    monkeypatch.setattr(writepath, "checkpoint_update", spy)
    body = envelope()
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "charging"}),
                   expected=0)
    put_checkpoint(wendy, acme, dict(body, revision=2, payload={"phase": "completed"}), expected=1)
    assert taken == [True, True], "the updates did not take the SQL path"
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    assert chains(acme)[run.pk] == [("", S.HEALTHY), (S.HEALTHY, S.COMPLETED)]
    assert_history_true(acme)


# --------------------------------------------------------------------------------------
# The range
# --------------------------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 0, 30, tzinfo=UTC)


def test_named_ranges_end_now_and_pick_their_bucket():
    w = reports.window("24h", None, None, NOW)
    assert (w.start, w.end, w.bucket) == (NOW - timedelta(hours=24), NOW, "hour")
    assert len(w.buckets()) == 25 and w.buckets()[0] == datetime(2026, 11, 30, 0, tzinfo=UTC)
    w = reports.window(None, None, None, NOW)
    assert (w.name, w.bucket, len(w.buckets())) == ("7d", "day", 8)
    assert reports.window("30d", None, None, NOW).start == NOW - timedelta(days=30)


def test_a_custom_range_takes_dates_or_times():
    w = reports.window(None, "2026-11-01", "2026-11-30", NOW)
    assert (w.name, w.start, w.end, w.bucket) == (
        "custom", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC), "day")
    w = reports.window("custom", "2026-11-30T10:00+02:00", "2026-11-30T12:00Z", NOW)
    assert (w.start, w.bucket, len(w.buckets())) == (
        datetime(2026, 11, 30, 8, tzinfo=UTC), "hour", 4)


@pytest.mark.parametrize(("args", "field"), [
    (("week", None, None), "range"),
    (("7d", "2026-11-01", None), "from"),
    (("24h", None, "2026-11-01"), "to"),
    (("custom", None, "2026-11-01"), "from"),
    (("custom", "2026-11-01", None), "to"),
    (("custom", "yesterday", "2026-11-01"), "from"),
    (("custom", "2026-11-01", "2026-13-01"), "to"),
    (("custom", "2026-11-02", "2026-11-01"), "to"),
    (("custom", "2026-11-01T00:00Z", "2026-11-01T00:30Z"), "to"),
    (("custom", "2025-01-01", "2026-11-01"), "to"),
    (("custom", "1999-12-31", "2000-01-02"), "from"),
])
def test_a_bad_range_is_refused_naming_the_field(args, field):
    with pytest.raises(InvalidPayload) as caught:
        reports.window(*args, NOW)
    assert caught.value.detail.startswith(f"{field}: "), caught.value.detail


#: Custom ranges at the edges of the calendar: reading them must not overflow Python's
#: ``datetime`` (year 1 to 9999) on the way to a 400 (issue 9 report fixes, item 1).
CALENDAR_EDGES = [
    (("custom", "9999-01-01", "9999-12-31"), "from"),
    (("custom", "9999-12-01", "9999-12-31T23:59"), "from"),
    (("custom", "9999-12-31T20:00", "9999-12-31T23:30"), "from"),
    (("custom", "0001-01-01T00:00+01:00", "2001-01-01"), "from"),
    (("custom", "2020-01-01", "9999-12-31T23:00-05:00"), "to"),
    (("custom", "2020-01-01", "9999-12-31"), "to"),
    (("custom", "8999-12-31", "9000-01-01"), "to"),
    (("custom", "8999-12-31T20:00", "8999-12-31T23:00-05:00"), "to"),
    (("custom", "2000-01-01T00:00+14:00", "2000-01-02"), "from"),
]


@pytest.mark.parametrize(("args", "field"), CALENDAR_EDGES)
def test_a_range_at_the_calendar_edges_is_refused_naming_the_field(args, field):
    with pytest.raises(InvalidPayload) as caught:
        reports.window(*args, NOW)
    assert caught.value.detail.startswith(f"{field}: "), caught.value.detail


def test_the_last_day_before_the_year_9000_is_a_range():
    w = reports.window("custom", "8999-12-30", "8999-12-31", NOW)
    assert (w.start, w.end) == (datetime(8999, 12, 30, tzinfo=UTC), reports.LATEST)
    assert w.buckets()[-1] == datetime(8999, 12, 31, 23, tzinfo=UTC)


def test_the_longest_custom_range_is_366_days():
    assert len(reports.window("custom", "2025-01-01", "2026-01-01", NOW).buckets()) == 366


# --------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["=1+2", "+1", "-1", "@SUM(A1)", "\tx", "\rx",
                                  "=HYPERLINK(\"http://x\")"])
def test_a_cell_a_spreadsheet_would_run_is_quoted(text):
    assert reports.csv_cell(text) == "'" + text


def test_other_cells_are_as_they_are():
    assert [reports.csv_cell(v) for v in ("acme.order", "a=b", 3, 2.5, 1.0, None)] == [
        "acme.order", "a=b", "3", "2.5", "1", ""]
    assert reports.csv_cell(NOW) == "2026-12-01T00:30:00Z"


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

def _history(tenant, run, *steps):
    """Transitions of ``run`` at the given times (the triggers' own rows stay, at now)."""
    RunTransition.objects.bulk_create([
        RunTransition(tenant=tenant, run=run, from_state=a, to_state=b, at=at)
        for a, b, at in steps])


@pytest.mark.django_db
def test_time_to_resolve_runs_from_the_first_doubt_to_the_next_resolution(acme, wendy, vic):
    one, two, old = (Run.objects.for_tenant(acme).get(uuid=put_checkpoint(
        wendy, acme, envelope()).run.uuid) for _ in range(3))
    d = datetime(2026, 11, 10, tzinfo=UTC)
    h = timedelta(hours=1)
    _history(acme, one,
             ("", S.HEALTHY, d), (S.HEALTHY, S.AMBIGUOUS, d + h),          # doubt at +1 h
             (S.AMBIGUOUS, S.AWAITING_APPROVAL, d + 2 * h),
             (S.AWAITING_APPROVAL, S.HEALTHY, d + 5 * h),                  # resolved: 4 h
             (S.HEALTHY, S.UNKNOWN_OUTCOME, d + 6 * h),
             (S.UNKNOWN_OUTCOME, S.CLOSED, d + 8 * h))                     # resolved: 2 h
    _history(acme, two, (S.HEALTHY, S.CONFLICTED, d), (S.CONFLICTED, S.HEALTHY, d + h))
    _history(acme, old, (S.HEALTHY, S.AMBIGUOUS, d - 30 * h),             # resolved before
             (S.AMBIGUOUS, S.HEALTHY, d - 29 * h),
             (S.HEALTHY, S.AMBIGUOUS, d - 10 * h),                          # doubt before
             (S.AMBIGUOUS, S.COMPLETED, d + 10 * h))                       # ... 20 h
    data = reports.figures(user=vic, tenant=acme, range_name="custom",
                           start="2026-11-10", end="2026-11-10")
    assert data["time_to_resolve_s"] == {"n": 3, "p50": 4 * 3600.0,
                                         "p95": pytest.approx(18.4 * 3600),
                                         "max": 20 * 3600.0}
    entering = data["runs_entering"]
    assert data["range"]["bucket"] == "hour" and len(data["buckets"]) == 24
    assert entering[S.AMBIGUOUS][1] == 1 and sum(entering[S.AMBIGUOUS]) == 1
    assert sum(entering[S.HEALTHY]) == 3 and entering[S.HEALTHY][0] == 1
    assert sum(entering[S.CLOSED]) == 1 and entering[S.CLOSED][8] == 1
    assert list(entering)[:3] == [S.AMBIGUOUS, S.UNKNOWN_OUTCOME, S.CONFLICTED]


@pytest.mark.django_db
def test_the_figures_count_what_happened_in_the_range(acme, globex, wendy, wes, rita, vic):
    from tests.conftest import _person

    approver = _person("=HYPERLINK(\"http://evil\")", acme, "approver")  # from an SSO
    put_checkpoint(wendy, acme, envelope(kind="acme.other", payload={"x": "y" * 100}))
    for n in (10, 20, 30, 40):
        put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "pad": "z" * n}))
    put_checkpoint(wes, globex, envelope(payload={"phase": "ready", "pad": "z" * 999}))
    run_id = ambiguous_run(wendy, acme)
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="go")
    services.retry_approve(actor=approver, tenant=acme, retry_id=retry.pk, reason="ok")
    data = reports.figures(user=vic, tenant=acme, range_name="24h")
    assert data["schema_mismatches"] == data["runs_entering"][S.SCHEMA_MISMATCH]
    assert sum(data["schema_mismatches"]) == 1                     # the unknown kind
    sizes = data["checkpoint_size_bytes"]
    assert set(sizes) == {"acme.order", "acme.other"}
    assert sizes["acme.order"]["n"] == 5 and sizes["acme.order"]["max"] < 999
    assert sizes["acme.order"]["p50"] == sorted(
        r.payload_size for r in CheckpointRevision.objects.for_tenant(acme).filter(
            kind="acme.order"))[2]
    assert data["approvals"] == {approver.username: {"approved": 1, "rejected": 0}}
    assert sum(data["runs_entering"][S.AWAITING_APPROVAL]) == 1
    assert sum(data["runs_entering"][S.RETRY_APPROVED]) == 1
    assert sum(data["runs_entering"][S.HEALTHY]) == 6                # every run's creation
    # A CSV of an injected name keeps it inert.
    text = reports.to_csv(data, "approvals")
    assert text.startswith("approver,approved,rejected,from,to,as_of\r\n")
    assert "\r\n\"'=HYPERLINK(\"\"http://evil\"\")\",1,0," in text, text
    # Nothing outside the range.
    assert reports.figures(user=vic, tenant=acme, range_name="custom", start="2026-01-01",
                           end="2026-01-02")["checkpoint_size_bytes"] == {}


@pytest.mark.django_db
def test_the_report_needs_a_role_in_the_tenant(acme, globex, vic, omar):
    with pytest.raises(NotFound):
        reports.figures(user=omar, tenant=acme)
    assert reports.figures(user=vic, tenant=acme)["range"]["name"] == "7d"


@pytest.mark.django_db
def test_the_figures_cost_the_same_for_few_and_many_rows(acme, wendy, rita, vic,
                                                        django_assert_num_queries):
    def cost(name):
        reports.figures(user=vic, tenant=acme, range_name=name)  # the rights, cached
        with django_assert_num_queries(10):
            reports.figures(user=vic, tenant=acme, range_name=name)

    put_checkpoint(wendy, acme, envelope())
    for name in ("24h", "30d"):
        cost(name)
    for _ in range(20):
        put_checkpoint(wendy, acme, envelope(kind=f"acme.k{uuid.uuid4().hex[:6]}"))
    run_id = ambiguous_run(wendy, acme)
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="done")
    services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    for name in ("24h", "30d"):
        cost(name)


# --------------------------------------------------------------------------------------
# The resume record
# --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_claimed_resume_is_recorded_with_the_checkpoint_age(acme, wendy, vic):
    body = envelope()
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
    assert not ResumeDecision.objects.for_tenant(acme).exists()   # a preview writes none
    answer = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    (row,) = ResumeDecision.objects.for_tenant(acme)
    assert (row.action, row.reason) == (answer["action"], answer["reason"])
    assert row.action == ResumeAction.CONTINUE
    assert 0 <= row.checkpoint_age_ms < 60_000
    ages = reports.figures(user=vic, tenant=acme, range_name="24h")["resume_age_ms"]
    assert ages == {ResumeAction.CONTINUE: {"n": 1, "p50": float(row.checkpoint_age_ms),
                                            "p95": float(row.checkpoint_age_ms),
                                            "max": float(row.checkpoint_age_ms)}}


# --------------------------------------------------------------------------------------
# Colours (issue 9 report fixes, item 3)
# --------------------------------------------------------------------------------------

def _css_colours() -> dict[str, tuple[str, str, str]]:
    """``{family: (--family, --family-ink, .badge-family border)}`` as app.css writes them."""
    from pathlib import Path

    css = (Path(__file__).resolve().parents[2] / "static/css/app.css").read_text()
    out = {}
    for family in reports.SHADES:
        main = re.search(rf"--{family}:\s*(#[0-9a-f]{{6}})", css).group(1)
        ink = re.search(rf"--{family}-ink:\s*(#[0-9a-f]{{6}})", css).group(1)
        border = re.search(rf"\.badge-{family}\s*{{[^}}]*border-color:\s*(#[0-9a-f]{{6}})",
                           css).group(1)
        out[family] = (main, ink, border)
    return out


def test_the_chart_shades_are_the_dashboards_colours():
    assert reports.SHADES == _css_colours()


def test_every_state_outcome_and_answer_has_one_colour_of_its_badge():
    from checkpoints.templatetags.dashboard import BADGE_CLASSES
    from checkpoints.vocab import ConflictReason, EffectState, ReconcileAnswer, ReconcileState

    words = {*RecoveryState.values, *EffectState.values, *ReconcileState.values,
             *ReconcileAnswer.values, *ConflictReason.values}
    assert words <= set(reports.FILL)
    for word, fill in reports.FILL.items():
        family = BADGE_CLASSES.get(word, "orange")     # refusals: conflicts are orange
        assert fill in reports.SHADES[family], (word, fill, family)
    css = _css_colours()
    assert reports.FILL[RecoveryState.AMBIGUOUS] == css["amber"][0]
    assert reports.FILL[RecoveryState.CONFLICTED] == css["orange"][0]
    assert reports.FILL[RecoveryState.AWAITING_APPROVAL] == css["blue"][0]
    assert reports.FILL[RecoveryState.UNKNOWN_OUTCOME] == css["red"][0]
    assert reports.FILL[EffectState.NOT_EXECUTED] == reports.FILL[ReconcileAnswer.NOT_EXECUTED]
    # The words one chart can draw together are told apart.
    for chart in (RecoveryState.values, ConflictReason.values, ReconcileAnswer.values,
                  [*EffectState.values, *ReconcileState.values, ReconcileAnswer.MOVED_ON]):
        fills = [reports.FILL[w] for w in chart]
        assert len(set(fills)) == len(fills), chart


def test_a_bar_chart_takes_no_colours_but_the_one_map():
    import inspect

    assert list(inspect.signature(reports.bar_chart).parameters) == [
        "series", "buckets", "bucket"]
    buckets = [NOW]
    chart = reports.bar_chart({"not_executed": [1], "ambiguous": [2], "elsewhere": [1]},
                              buckets, "hour")
    assert {e["name"]: e["fill"] for e in chart["legend"]} == {
        "not_executed": reports.FILL["not_executed"], "ambiguous": reports.FILL["ambiguous"],
        "elsewhere": reports.OTHER_FILL}
    assert {b["fill"] for b in chart["bars"]} == {e["fill"] for e in chart["legend"]}
    assert [b["title"] for b in chart["bars"]][0].endswith("not executed 1")
