"""No template shows a comment as text (the operator's walk: the 500 page of a node without
collectstatic began with the remark of ``templates/error_base.html``, then the doctype).

Django's ``{# ... #}`` is one line only: a ``{#`` whose ``#}`` is on a later line is
copied to the page as it is, and text before ``<!DOCTYPE html>`` puts browsers in quirks
mode. A remark over several lines is ``{% comment %} ... {% endcomment %}``. The lint
reads every template, rendered by a test or not; the error pages (rendered without a
request, as ``checkpoints.api.errors`` does) are checked as served too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.template import loader

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIRS = (ROOT / "templates", ROOT / "checkpoints" / "templates")
ONE_LINE_COMMENT = re.compile(r"\{#.*?#\}")  # Django's own: no DOTALL


def unclosed_comments(text: str, name: str) -> list[str]:
    """``name:line`` for each line where a ``{#`` or ``#}`` is left once the one-line
    comments Django removes are taken out: a comment the page would show as text."""
    return [f"{name}:{number}" for number, line in enumerate(text.splitlines(), 1)
            if "{#" in ONE_LINE_COMMENT.sub("", line) or "#}" in ONE_LINE_COMMENT.sub("", line)]


def _templates():
    for directory in TEMPLATE_DIRS:
        if directory.is_dir():
            yield from sorted(directory.rglob("*.html"))


def test_the_lint_finds_a_comment_over_two_lines_and_passes_one_line_comments():
    assert unclosed_comments("{# one #}<p>{{ x }}{# two #}</p>", "t") == []
    assert unclosed_comments("{# begins\n   ends #}\n<!DOCTYPE html>", "t") == ["t:1", "t:2"]
    assert unclosed_comments("<p>{#</p>", "t") == ["t:1"]


def test_no_template_has_a_comment_over_several_lines():
    paths = list(_templates())
    assert len(paths) > 20  # the scan sees the dashboard's templates
    found = [problem for path in paths
             for problem in unclosed_comments(path.read_text(encoding="utf-8"),
                                              str(path.relative_to(ROOT)))]
    assert found == [], "use {% comment %} ... {% endcomment %} for a remark over lines"


@pytest.mark.parametrize(("name", "context"), [
    ("500.html", {"static_missing": True}),
    ("500.html", {"static_missing": False}),
    ("503.html", {"service": "database", "retry_after": 5}),
])
def test_the_error_pages_begin_with_the_doctype_and_show_no_comment(name, context):
    text = loader.render_to_string(name, context)
    assert text.startswith("<!DOCTYPE html>"), text[:120]
    assert "{#" not in text and "#}" not in text
    assert "{% comment" not in text and "self-contained" not in text
