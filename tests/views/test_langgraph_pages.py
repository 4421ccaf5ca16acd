"""The dashboard with a LangGraph run (issue 10): a crashed graph is in the inbox's
ambiguous tab, its run page and its envelope's history render, labels name nodes and
never a channel value, a reviewer's reveal shows the summary (no channel value either),
and a thread deleted while a conflict stays leaves a closed run that still renders."""

from __future__ import annotations

import pytest
from django.urls import reverse

from checkpoints.exceptions import ThreadConflict
from checkpoints.interop import langgraph
from recovery_client.protocol import thread_checkpoint_id, thread_run_id
from tests.helpers import graph_put, graph_writes, lg_put, lg_writes, sweep_later, typed

pytestmark = pytest.mark.django_db

SECRET = "card-4242-4242"


@pytest.fixture
def crashed(acme, wendy):
    """A refund graph that stopped inside its charge node: checkpoint 2 in flight, one of
    its two tasks written, a refused put kept as a conflict, then the owner went quiet."""
    ident = {"workflow": "refund", "definition_version": "3"}
    graph_put(wendy, acme, lg_put("refund-7", "1f0c-01", values={"card": SECRET},
                                  nodes=["lookup"], identity=ident))
    graph_put(wendy, acme, lg_put("refund-7", "1f0c-02", parent="1f0c-01",
                                  values={"card": SECRET}, nodes=["charge", "notify"]))
    graph_writes(wendy, acme, lg_writes("refund-7", "1f0c-02", "task-notify",
                                        [(0, "sent", SECRET)]))
    with pytest.raises(ThreadConflict):
        graph_put(wendy, acme, lg_put("refund-7", "1f0c-03", parent="1f0c-01"))
    sweep_later()
    return thread_run_id("refund-7")


def test_a_crashed_graph_is_in_the_ambiguous_tab(login, rita, crashed):
    response = login(rita).get(reverse("run_list", args=["acme"]))
    assert response.status_code == 200
    assert [r["uuid"] for r in response.context["rows"]] == [crashed]
    body = response.content.decode()
    assert "langgraph.checkpoint" in body and "refund" in body


def test_its_run_page_renders_with_node_labels_and_no_channel_value(login, rita, crashed):
    response = login(rita).get(reverse("run_detail", args=["acme", crashed]))
    body = response.content.decode()
    assert response.status_code == 200
    assert str(crashed) in body and "langgraph.checkpoint" in body
    assert "running charge, notify (1/2 tasks written)" in body  # the timeline's label
    assert "running lookup (0/1 tasks written)" in body
    assert "ambiguous" in body and "refund" in body
    assert SECRET not in body and typed(SECRET)["b64"] not in body


def test_its_envelope_history_and_reveal_render(login, rita, crashed):
    client = login(rita)
    cid = thread_checkpoint_id("refund-7", "")
    history = client.get(reverse("checkpoint_history", args=["acme", cid]))
    assert history.status_code == 200
    assert SECRET not in history.content.decode()
    revealed = client.post(reverse("checkpoint_reveal", args=["acme", cid]),
                           {"reason": "what was it doing"})
    assert revealed.status_code == 200
    text = revealed.content.decode()
    assert "written_tasks" in text and "1f0c-02" in text
    assert SECRET not in text and typed(SECRET)["b64"] not in text


def test_a_deleted_thread_with_a_conflict_leaves_a_closed_run_that_renders(login, rita, wendy,
                                                                         acme, crashed):
    langgraph.graph_thread_delete(actor=wendy, tenant=acme, thread_id="refund-7")
    response = login(rita).get(reverse("run_detail", args=["acme", crashed]))
    assert response.status_code == 200
    assert "closed" in response.content.decode()
