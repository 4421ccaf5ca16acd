"""Attack on today's change (``git diff a0330c3..HEAD``): the tombstoned run ids, the
stored jobs' requester read before each batch, the name rule of Unicode's default
ignorables. Each test is a finding: it fails on the code it was written against, and
says its fault kind and the input that shows it.
"""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints.models import BulkAction, Run
from tests.api.apihelpers import put_fx, url
from tests.helpers import effect_body, envelope, put_checkpoint

pytestmark = pytest.mark.django_db


# --------------------------------------------------------------------------------------
# Finding 1, kind (k)/(c): one rule, two doors. The API's bulk body ``filters`` (kind,
# subject, q) takes a value the name rule refuses, while the same filters as a query
# string (``GET …/runs?kind=``, the dashboard's bulk bar, both ``single_values``) are
# refused with ``name_problem``'s words.
# --------------------------------------------------------------------------------------

#: A run whose names were stored before today's rule (docs/security/input.md: "A name
#: stored before a rule refused it stays ... found by a filter or search without that
#: character"; "A query value ... that carries the refused character is refused").
LEGACY_AGENT = "billing\u2062legacy"
HIDDEN = {
    "subject": "\u2062legacy",          # an invisible operator (today's widened set)
    "q": "billing\u2062legacy",
}


def legacy_run(writer, tenant) -> Run:
    body = envelope()
    put_checkpoint(writer, tenant, body)
    Run.objects.for_tenant(tenant).filter(uuid=body["run_id"]).update(agent=LEGACY_AGENT)
    return Run.objects.for_tenant(tenant).get(uuid=body["run_id"])


@pytest.mark.parametrize("field", sorted(HIDDEN))
def test_the_list_query_refuses_a_hidden_character_in_a_filter(api_as, acme, wendy, rita,
                                                               field):
    """The reference: the list's query string refuses each value (holds on HEAD)."""
    legacy_run(wendy, acme)
    answer = api_as(rita).get(url("acme", "runs"), {field: HIDDEN[field]})
    assert answer.status_code == 400, answer.content
    assert answer.json()["detail"] == f"{field}: an invisible character is not allowed"


@pytest.mark.parametrize("field", sorted(HIDDEN))
def test_the_bulk_body_refuses_the_same_filter_value(api_as, acme, wendy, rita, field):
    """FINDING: ``api.views.bulk._bulk_filters`` checks subject (and kind) with
    ``text_problem`` only and q with ``search_terms`` (controls only): 201, the bulk
    acting on the legacy run the list cannot be asked for with that value."""
    legacy_run(wendy, acme)
    answer = api_as(rita).post(
        url("acme", "bulk-actions"),
        data=json.dumps({"action": "reconcile", "reason": "attack",
                         "client_token": str(uuid.uuid4()),
                         "filters": {field: HIDDEN[field]}}),
        content_type="application/json")
    assert answer.status_code == 400, (answer.status_code, answer.content)
    assert answer.json()["detail"] == f"filters.{field}: an invisible character is not allowed"
    assert not BulkAction.objects.for_tenant(acme).exists()


# --------------------------------------------------------------------------------------
# Finding 2, kind (k): the name rule's own example, with a character the rule lets
# through. ``charge:\u200bA-1042`` is refused because it "reads as charge:A-1042, another
# operation key a reviewer would take for the one they know" (jsonparse.INVISIBLE). A
# variation selector after an ASCII letter (no standardized variation sequence: it
# selects nothing and shows nothing) and a zero-width joiner between two ASCII
# characters (joins nothing) read the same, and are taken as new keys.
# --------------------------------------------------------------------------------------

LOOKALIKE_KEYS = {
    "zwsp (reference, refused)": "charge:\u200bA-1042",
    "vs1 after a letter": "charge:A\ufe00-1042",
    "vs17 after a letter": "charge:A\U000e0100-1042",
    "zwj between ascii": "charge:\u200dA-1042",
}


@pytest.mark.parametrize("label", sorted(LOOKALIKE_KEYS))
def test_an_operation_key_that_reads_as_another_is_refused(api_as, acme, wendy, label):
    """FINDING (but the zwsp reference): 201, a second effect whose key shows as the
    first's; expected the 400 ``operation_key: an invisible character is not allowed``."""
    client = api_as(wendy)
    first = put_fx(client, "acme", effect_body(operation_key="charge:A-1042"), create=True)
    assert first.status_code == 201, first.content
    twin = put_fx(client, "acme", effect_body(operation_key=LOOKALIKE_KEYS[label]),
                  create=True)
    assert twin.status_code == 400, (twin.status_code, twin.content)
    assert twin.json()["detail"] == "operation_key: an invisible character is not allowed"
