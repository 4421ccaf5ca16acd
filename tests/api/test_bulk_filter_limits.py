"""A bulk action's ``filters`` take the lengths of the columns they match, read from the
model (issue 22's stop, item 4): ``kind`` ``Run.kind``, ``subject`` ``Run.agent`` and
``Run.workflow``, ``q`` the search's ``SEARCH_MAX`` (the inbox's box and ``GET …/runs?q=``).
The body's check (``views.bulk._bulk_filters``) and its schema
(``BulkFiltersSerializer``) carried a copy (200, 256, 512) that a migration widening a
column would have left behind."""

from __future__ import annotations

import importlib
import uuid

import pytest

from checkpoints import selectors
from checkpoints.api import params
from checkpoints.api.serializers import bulk as bulk_shapes
from checkpoints.dashboard.forms import InboxFilterForm
from checkpoints.models import Run
from tests.conftest import bearer_client

pytestmark = pytest.mark.django_db

COLUMNS = {"kind": ("kind",), "subject": ("agent", "workflow")}


def _column(name: str) -> int:
    return max(Run._meta.get_field(c).max_length for c in COLUMNS[name])


@pytest.fixture
def widened(monkeypatch):
    """``widen(column, n)``: ``Run.<column>`` as if a migration made it ``n`` long; the
    bulk shapes are built again under it, and again as they were afterwards."""
    def widen(column: str, n: int) -> None:
        monkeypatch.setattr(Run._meta.get_field(column), "max_length", n)
        importlib.reload(bulk_shapes)

    yield widen
    monkeypatch.undo()
    importlib.reload(bulk_shapes)


def test_the_bulk_filters_limits_are_the_columns_and_the_search(api_as, rita):
    fields = bulk_shapes.BulkFiltersSerializer().fields
    assert fields["kind"].max_length == _column("kind") == params.RunListParams().fields[
        "kind"].max_length
    assert fields["subject"].max_length == _column("subject") == params.RunListParams(
        ).fields["subject"].max_length
    assert fields["q"].max_length == selectors.SEARCH_MAX == InboxFilterForm().fields[
        "q"].max_length
    schema = api_as(rita).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    shown = schema["components"]["schemas"]["BulkFilters"]["properties"]
    assert (shown["kind"]["maxLength"], shown["subject"]["maxLength"],
            shown["q"]["maxLength"]) == (_column("kind"), _column("subject"),
                                         selectors.SEARCH_MAX)


@pytest.mark.parametrize(("name", "columns"), [("kind", ("kind",)),
                                               ("subject", ("agent", "workflow"))])
def test_a_widened_column_widens_the_filter_that_matches_it(rita, widened, name, columns):
    """Each column widened as a migration would: the schema's limit and the body's check
    follow it (a value one past the old limit is taken, one past the new one is a 400
    naming ``filters.<name>``); nothing copied is left behind."""
    new = _column(name) + 44
    for column in columns:
        widened(column, new)
    assert bulk_shapes.BulkFiltersSerializer().fields[name].max_length == new
    assert selectors.filter_limit(name) == new
    api = bearer_client(rita)

    def submit(value: str):
        return api.post("/api/v1/tenants/acme/bulk-actions", {
            "action": "request_retry", "reason": "r", "client_token": str(uuid.uuid4()),
            "filters": {"recovery_state": "ambiguous", name: value}}, format="json")

    taken = submit("x" * new)  # past the length check: then no run matches it
    assert taken.json()["detail"] == "filters: no run matches them", taken.content
    refused = submit("x" * (new + 1))
    assert refused.status_code == 400
    assert refused.json()["detail"].startswith(f"filters.{name}:")
