"""A production node whose static files manifest is missing or stale says so (issue 17,
item 5; checkpoints/ops/staticcheck.py): ``/readyz`` answers 503 naming ``static_manifest``,
and a page answers a self-contained 500 page saying what is wrong instead of a bare
"Server Error (500)". ``manage.py check --deploy``'s ``recovery.E002``:
tests/test_deploy_check.py."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from checkpoints.ops.staticcheck import needed_static_paths

pytestmark = pytest.mark.django_db

MANIFEST_STORAGE = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}


def _manifest(root, paths):
    (root / "staticfiles.json").write_text(json.dumps(
        {"paths": {p: p.replace(".", ".0123456789ab.", 1) for p in paths},
         "version": "1.1", "hash": "0123456789ab"}))


@pytest.fixture
def production_static(settings, tmp_path):
    """Manifest storage over an empty ``STATIC_ROOT`` (collectstatic skipped)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True  # no broker in this test
    settings.RECOVERY_STATIC_MANIFEST = True
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STATIC_ROOT.mkdir()
    settings.STORAGES = MANIFEST_STORAGE  # resets the storages (Django's setting_changed)
    return settings


def test_the_templates_need_the_dashboard_assets():
    assert {"css/app.css", "js/app.js"} <= needed_static_paths()


def test_readyz_names_a_missing_manifest(production_static):
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    answer = response.json()
    assert (answer["status"], answer["checks"]) == ("unavailable", {
        "audit": "ok", "broker": "not configured", "database": "ok", "login_slots": "ok",
        "migrations": "ok",
        "notifications": "not configured",
        "retention": "not configured",
        "worker": "not configured", "static_manifest": "failed: StaticManifestError"})


def test_readyz_names_a_stale_manifest_and_is_ok_with_a_complete_one(production_static,
                                                                       settings):
    root = settings.STATIC_ROOT
    _manifest(root, sorted(needed_static_paths() - {"css/app.css"}))
    settings.STORAGES = {**MANIFEST_STORAGE}  # a new process: reads the manifest again
    assert Client().get("/readyz").json()["checks"]["static_manifest"] == \
        "failed: StaticManifestError"
    _manifest(root, sorted(needed_static_paths()))
    settings.STORAGES = {**MANIFEST_STORAGE}
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["static_manifest"] == "ok"


def test_a_page_without_its_manifest_says_what_is_wrong(production_static, rita, acme):
    anonymous = Client(raise_request_exception=False)
    client = Client(raise_request_exception=False)
    client.force_login(rita)
    for who, path in ((anonymous, "/login/"), (client, f"/t/{acme.slug}/")):
        response = who.get(path)
        assert response.status_code == 500, path
        text = response.content.decode()
        assert "Server Error (500)" not in text, path  # not Django's bare page
        assert "static files are not installed" in text, path
        assert "collectstatic" in text, path
        assert "/static/" not in text and "Traceback" not in text, path
