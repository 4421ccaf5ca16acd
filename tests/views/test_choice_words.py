"""A refused choice in a dashboard query string names the choices there are, as the API's
query parameters do (``forms.first_error``, ``api.params.check``): the stop-38 newcomer
met a bare "Select a valid choice" on ``?range=`` and ``?state=`` and guessed."""

from __future__ import annotations

import html

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url, words", [
    ("/t/acme/report/?range=1h", "range: Select a valid choice. 1h is not one of the "
                                 "available choices. One of: 24h, 7d, 30d, custom."),
    ("/t/acme/?state=bogus", "state: Select a valid choice. bogus is not one of the "
                             "available choices. One of: all, healthy, ambiguous,"),
])
def test_a_refused_choice_names_the_choices(login, rita, url, words):
    answer = login(rita).get(url)
    assert answer.status_code == 400
    assert words in html.unescape(answer.content.decode())


def test_another_refusal_keeps_its_words(login, rita):
    answer = login(rita).get("/t/acme/?kind=" + "k" * 201)
    assert answer.status_code == 400
    body = html.unescape(answer.content.decode())
    assert "kind: Ensure this value has at most 200 characters" in body
    assert "One of:" not in body
