"""Attack on the last hour's change (``git diff 3803463~1..HEAD``): the name rule's
joiners and variation selectors by place, the Data page's policy form that lets the
service judge. Each test is a finding: it fails on the code it was written against, and
says its fault kind and the input that shows it.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from checkpoints.exceptions import InvalidPayload
from checkpoints.jsonparse import check_name, name_problem
from checkpoints.models import AuditEvent, DataPolicy
from tests.api.apihelpers import new_checkpoint, put, snapshot
from tests.helpers import effect_body, form_fields
from tests.lifecycle.retention_world import set_policy
from tests.views.conftest import login

session_login = login  # the views' session-client fixture, under a name of its own here
del login

pytestmark = pytest.mark.django_db

WORDS = "an invisible character is not allowed"


# --------------------------------------------------------------------------------------
# Finding 1, kind (a)/(k): a keycap's presentation selector is allowed after any digit,
# keycap or not. "1\ufe0f" without U+20E3 is no keycap: the selector shows nothing, so
# the all-ASCII-looking operation key "charge:A-1\ufe0f042" reads as charge:A-1042, the
# very homograph the stop's rule was written to refuse (charge:A\ufe00-1042).
# --------------------------------------------------------------------------------------

HOMOGRAPHS = ["charge:A-1\ufe0f042", "charge:A-1\ufe0e042", "charge:#\ufe0fA-1042"]


@pytest.mark.parametrize("key", HOMOGRAPHS)
def test_a_keycap_selector_without_a_keycap_hides_in_a_name(key):
    """FINDING: ``_selects`` allows FE0E/FE0F after any of [0-9#*] whatever follows;
    only ``<base> FE0F U+20E3`` is a keycap. Expected the rule's words; got ""."""
    assert name_problem(key) == WORDS, repr(key)
    assert name_problem("1\ufe0f\u20e3") == ""  # the real keycap stays a name


@pytest.mark.parametrize("key", HOMOGRAPHS)
def test_the_api_takes_an_operation_key_that_reads_as_another(api_as, wendy, key):
    """FINDING through the door: ``PUT …/effects`` stores ``charge:A-1\\ufe0f042`` (201)
    beside ``charge:A-1042``: two keys a reviewer cannot tell apart on the run page.
    Expected 400 ``operation_key: an invisible character is not allowed``."""
    w = api_as(wendy)
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    r = put(w, "acme", "effects", effect_body(run_id=rid, operation_key=key), create=True)
    assert r.status_code == 400, (r.status_code, r.content[:300])
    assert r.json()["detail"] == f"operation_key: {WORDS}"
    assert snapshot() == before


# --------------------------------------------------------------------------------------
# Finding 2, kind (a): "a variation selector only after a non-ASCII character that
# shows": any of the 256 selectors (VS17-256 included) after a Latin letter such as "é"
# selects nothing and shows nothing. So "charg\u00e9\U000E0100:A-1042" reads as
# chargé:A-1042, and one selector after each non-ASCII letter still smuggles a hidden byte
# a letter ("emoji smuggling", which ``_selects``'s docstring says the rule stops).
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "charg\u00e9\U000E0100:A-1042",                     # VS17 after é
    "charg\u00e9\ufe00:A-1042",                         # VS1 after é
    "".join(f"\u00e9{chr(0xE0100 + b)}" for b in b"rm -rf"),  # a byte per letter
])
def test_a_selector_after_a_letter_without_variants_hides(name):
    """FINDING: ``_selects`` asks only that the character before shows (``_base``), not
    that it has variants. Expected ``InvalidPayload`` with the rule's words from
    ``check_name``; got the name back."""
    with pytest.raises(InvalidPayload, match=WORDS):
        check_name(name, "operation_key", blank_words="must be a non-empty string")


# --------------------------------------------------------------------------------------
# Finding 3, kind (c)/(k): the Data page's policy form reads a duplicated field as its
# last value (QueryDict.__getitem__), where the API's body refuses a duplicated key and a
# query string refuses a name given twice (``querystring.single_values``). A POST of
# payload_retention_days=30&payload_retention_days= saves "keep payloads forever".
# --------------------------------------------------------------------------------------

def test_the_policy_form_takes_the_last_of_a_duplicated_field(session_login, acme, adam):
    """FINDING: ``forms.policy_fields`` uses ``post[name]``. Expected 400 naming
    ``payload_retention_days`` (given more than once), nothing written; got 303 and the
    retention set to forever (null) with a ``data_policy.set`` audit event."""
    set_policy(acme, payload_retention_days=30)
    client = session_login(adam)
    form = form_fields(client.get("/t/acme/data/").content.decode(), "f-data-policy")
    events = AuditEvent.objects.for_tenant(acme).count()
    pairs = [(k, v) for k, v in form.items() if k != "payload_retention_days"]
    body = urlencode(pairs + [("payload_retention_days", "30"),
                              ("payload_retention_days", "")])
    answer = client.post("/t/acme/data/policy/", body,
                         content_type="application/x-www-form-urlencoded")
    assert answer.status_code == 400, answer.status_code
    assert "payload_retention_days" in answer.content.decode()
    assert DataPolicy.objects.for_tenant(acme).get().payload_retention_days == 30
    assert AuditEvent.objects.for_tenant(acme).count() == events



# --------------------------------------------------------------------------------------
# Finding 4, kind (k): "a blank name is refused as blank, one check_name for every
# required name" (3803463) missed a door: a LangGraph thread id (required, 1..256
# characters; a run identity shown on the run page and the thread list) takes the name
# rule through ``interop.langgraph.parse._text`` but no blank check, so a thread of a
# braille blank or of spaces is stored and shows as nothing.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("thread", ["\u2800", "   ", " \u2800 "])
def test_a_langgraph_thread_id_that_shows_nothing_is_stored(wendy, acme, thread):
    """FINDING: ``parse_put``/``check_thread_id`` accept it and ``graph_put`` stores a
    thread nobody can read or click. Expected ``InvalidPayload`` naming ``thread_id``
    (as an operation key or lease owner of the same characters gets); got a stored
    checkpoint."""
    from checkpoints.interop import langgraph
    from tests.helpers import graph_put, lg_put

    with pytest.raises(InvalidPayload, match="^thread_id: "):
        langgraph.check_thread_id(thread)
    before = snapshot()
    with pytest.raises(InvalidPayload, match="^thread_id: "):
        graph_put(wendy, acme, lg_put(thread, "01"))
    assert snapshot() == before
