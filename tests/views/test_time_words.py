"""Time and words for people (issue 9, item 5), server side: every time a page shows is a
``<time datetime>`` with its absolute UTC time in the title; epoch milliseconds show as
times beside the number; long values get an ellipsis box and a copy button; the audit
trail reads as sentences with the JSON behind a ``<details>`` toggle; marking an outcome
unknown from the dashboard needs the confirmation box (400 naming ``confirm``), while
the API body stays ``{"reason"}``."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from checkpoints import dbclock
from checkpoints.models import Effect
from checkpoints.selectors import nextstep
from checkpoints.templatetags import dashboard
from tests.views.test_access import _snapshot

TIME = re.compile(r'<time datetime="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)" '
                  r'title="(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC" '
                  r'data-now="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)">([^<]*)</time>')
#: What ``ago`` writes; outside a <time> element it is a time shown without one.
RELATIVE = re.compile(r"\b\d+ (s|min|h|d) ago\b|\bin \d+ (s|min|h|d)\b")


def bare_times(html: str) -> list[str]:
    """Relative times on the page that are not inside a ``<time datetime>``."""
    return RELATIVE.findall(TIME.sub("", html))


# ---- the filters ---------------------------------------------------------------------

@pytest.fixture
def page_clock():
    """What a request gives the filters: the database time its relative words are
    measured against (``dbclock.page_now``), here this process's time, with no query."""
    with dbclock.page_clock():
        dbclock.seed_page_now(timezone.now())
        yield


@pytest.mark.usefixtures("page_clock")
def test_when_is_a_time_element_with_the_utc_time_in_its_title():
    at = timezone.now() - timedelta(minutes=3, seconds=5)
    html = str(dashboard.when(at))
    match = TIME.fullmatch(html)
    assert match, html
    assert match.group(1) == at.astimezone(UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")
    assert match.group(2) == at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert match.group(4) == "3 min ago"
    # The page's database time, which the script counts on from (static/js/app.js).
    assert match.group(3) == dbclock.page_now().astimezone(UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
    assert dashboard.when(None) == "—"


def test_when_words_are_those_of_the_values_it_writes():
    """The script's first tick (static/js/app.js ``tick``) measures from the element's
    ``datetime`` to its ``data-now`` (both to the millisecond); the server's words
    must be that same measure, or a page's times change within a second of loading
    (stop 36's leftover). Generated over sub-second parts on both sides of each unit's
    boundary, in both directions."""
    base = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    checked = 0
    for now_us in (0, 1_000, 300_000, 999_000, 999_999):
        now = base + timedelta(microseconds=now_us)
        for age in (0, 1, 59, 60, 3599, 3600, 86399, 86400, -1, -60, -3600):
            for value_us in (0, 1, 500_000, 700_000, 999_999):
                value = now - timedelta(seconds=age) + timedelta(
                    microseconds=value_us - now_us)
                with dbclock.page_clock():
                    dbclock.seed_page_now(now)
                    match = TIME.fullmatch(str(dashboard.when(value)))
                at = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=UTC)
                shown = datetime.strptime(match.group(3), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=UTC)
                ms = (shown - at) // timedelta(milliseconds=1)  # as the script measures
                assert match.group(4) == nextstep.ago(at, at + timedelta(milliseconds=ms)), (
                    now, value)
                checked += 1
    assert checked == 275


@pytest.mark.usefixtures("page_clock")
def test_ms_time_shows_the_number_and_its_time_and_leaves_non_times_alone():
    html = str(dashboard.ms_time(1764547200000))
    assert html.startswith('<span class="mono">1764547200000</span>')
    assert '<time datetime="2025-12-01T00:00:00.000Z" title="2025-12-01 00:00:00 UTC" data-now=' in html
    assert dashboard.ms_time(None) == "—"
    assert dashboard.ms_time(2 ** 63 - 1) == str(2 ** 63 - 1)  # no year 9999+: as it is
    assert dashboard.ms_time(True) == "True"


@pytest.mark.usefixtures("page_clock")
def test_json_times_annotates_ms_lines_and_escapes_the_rest():
    text = json.dumps({"charged_at_ms": 1764547200000, "note": "<b>x</b>",
                       "count_ms": "12", "huge_ms": 10 ** 19}, indent=2, sort_keys=True)
    html = str(dashboard.json_times(text))
    lines = html.split("\n")
    charged = next(line for line in lines if "charged_at_ms" in line)
    assert charged.startswith('  &quot;charged_at_ms&quot;: 1764547200000,<span class="ms-note"')
    assert 'datetime="2025-12-01T00:00:00.000Z"' in charged
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>" not in html
    assert html.count("<time") == 1  # a string and an out-of-range number are not times
    assert html.count("\n") == text.count("\n")


def test_copyable_shows_a_short_id_or_clips_and_copies_the_whole_value():
    run_id = str(uuid.uuid4())
    html = str(dashboard.copyable(run_id, "run id"))
    assert f'title="{run_id}">{run_id[:8]}</span>' in html
    assert f'data-copy="{run_id}"' in html and 'aria-label="Copy run id"' in html
    hostile = 'worker "7" <script>'
    html = str(dashboard.copyable(hostile))
    assert "<script>" not in html and 'data-copy="worker &quot;7&quot; &lt;script&gt;"' in html
    assert dashboard.copyable("") == "—"


# ---- the pages -----------------------------------------------------------------------

def _run_page(client, run_id) -> str:
    return client.get(reverse("run_detail", args=["acme", run_id])).content.decode()


def test_every_time_on_the_pages_is_a_time_element(login, rita, unknown, acme, scripted):
    client = login(rita)
    client.post(reverse("run_retry_request", args=["acme", unknown.run_id]),
                {"reason": "worker died"})
    pages = {
        "run": _run_page(client, unknown.run_id),
        "audit": client.get(reverse("audit_log", args=["acme"])).content.decode(),
        "inbox": client.get(reverse("run_list", args=["acme"]) + "?state=all").content.decode(),
        "history": client.get(reverse("effect_history", args=["acme", unknown.effect_id])
                              + "?before=9").content.decode(),
        "audit fragment": client.get(reverse("run_audit", args=["acme", unknown.run_id]),
                                     HTTP_HX_REQUEST="true").content.decode(),
    }
    for name, html in pages.items():
        assert bare_times(html) == [], name
        assert TIME.search(html), name
    # The run page: last write, state change, revisions, effect history, retry, audit rows.
    assert len(TIME.findall(pages["run"])) >= 8
    # The writer's clock (updated_at_ms) beside each revision, as a time.
    assert re.search(r'writer clock <span class="mono">\d{13}</span> <span class="ms-time">'
                     r'\(<time datetime=', pages["run"])


def test_the_audit_trail_reads_as_sentences_with_the_json_behind_a_toggle(
        login, rita, unknown):
    html = _run_page(login(rita), unknown.run_id)
    panel = html[html.index('id="audit-panel"'):]
    assert ('<p class="sentence">rita marked charge:A-1042 at payments outcome unknown: '
            'gateway has no lookup</p>') in panel
    assert '<p class="sentence">system moved the run healthy → ambiguous' in panel
    row = panel[panel.index('data-action="effect.mark_unknown"'):]
    row = row[:row.index("</tr>")]
    assert '<details class="event-json">' in row and "<details open" not in row
    assert "&quot;state&quot;: &quot;unknown&quot;" in row  # the after JSON, escaped


def test_the_run_page_gives_long_values_a_copy_button(login, rita, stuck):
    html = _run_page(login(rita), stuck.run_id)
    assert f'data-copy="{stuck.run_id}"' in html
    assert f'data-copy="{stuck.checkpoint_id}"' in html
    assert 'data-copy="charge:A-1042"' in html


def test_revealed_json_shows_epoch_milliseconds_as_times(login, rita, acme, wendy):
    from tests.helpers import envelope, put_checkpoint

    body = envelope(payload={"phase": "ready", "paid_at_ms": 1764547200000})
    put_checkpoint(wendy, acme, body)
    response = login(rita).post(reverse("checkpoint_reveal", args=["acme", body["id"]]),
                                {"reason": "when was it paid"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert '"paid_at_ms": 1764547200000,<span class="ms-note"' in html.replace("&quot;", '"')
    assert 'datetime="2025-12-01T00:00:00.000Z"' in html
    written = datetime.fromtimestamp(body["updated_at_ms"] / 1000, tz=UTC)
    assert f'updated_at_ms <span class="mono">{body["updated_at_ms"]}</span>' in html
    assert 'datetime="' + written.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z") + '"' in html


# ---- mark unknown asks for a confirmation ----------------------------------------------

def _unknown_url(effect_id) -> str:
    return reverse("effect_mark_unknown", args=["acme", effect_id])


@pytest.mark.parametrize("extra", [{}, {"HTTP_HX_REQUEST": "true"}])
def test_mark_unknown_needs_the_confirmation_box_and_changes_nothing_without_it(
        login, rita, stuck, acme, extra):
    before = _snapshot(acme)
    client = login(rita)
    for data in ({"reason": "no lookup"}, {"reason": "no lookup", "confirm": ""}):
        response = client.post(_unknown_url(stuck.effect_id), data, **extra)
        assert response.status_code == 400
        assert b"confirm: tick the box to confirm marking the outcome unknown" in response.content
    assert _snapshot(acme) == before
    response = client.post(_unknown_url(stuck.effect_id),
                           {"reason": "no lookup", "confirm": "yes"}, **extra)
    assert response.status_code in (200, 303)
    assert Effect.objects.get(uuid=stuck.effect_id).state == "unknown"


def test_the_mark_unknown_form_has_the_box_and_the_dialog_question(login, rita, stuck):
    html = _run_page(login(rita), stuck.run_id)
    form = html[html.index('id="f-unknown-'):]
    form = form[:form.index("</form>")]
    assert 'name="confirm" value="yes" required' in form
    assert 'data-confirm="Mark the outcome of charge:A-1042 at payments unknown?' in form


def test_the_api_mark_unknown_body_stays_a_reason(api_as, rita, stuck):
    response = api_as(rita).post(f"/api/v1/tenants/acme/effects/{stuck.effect_id}/mark-unknown",
                                 {"reason": "no lookup"}, format="json")
    assert response.status_code == 200, response.content


def test_no_template_writes_a_relative_time_outside_a_time_element():
    """(stop 36; the attack's note) Every relative time a template writes is ``when``'s
    ``<time data-now>``, which the page's script keeps true while it stays open and
    localises; ``|ago`` alone wrote words that never moved (the erasure, legal hold, bulk,
    migration and kind pages)."""
    roots = [Path(d) for config in settings.TEMPLATES for d in config.get("DIRS", [])]
    found = [f"{path.name}:{n}" for root in roots for path in root.rglob("*.html")
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\|\s*ago\b", line)]
    assert found == []


def test_a_time_under_a_second_ahead_is_in_0_s():
    """(the stop-37 newcomer's finding) A lease live for another half second read
    "Expires 0 s ago live": the sign is the exact difference's, not the whole seconds'."""
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert nextstep.ago(now + timedelta(milliseconds=400), now) == "in 0 s"
    assert nextstep.ago(now - timedelta(milliseconds=400), now) == "0 s ago"
    assert nextstep.ago(now + timedelta(seconds=61, milliseconds=1), now) == "in 1 min"
