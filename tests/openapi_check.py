"""Every answer of the API, in every test, is checked against the OpenAPI schema that
``/api/schema/`` serves (issue 7, item 5).

``tests/conftest.py`` wraps Django's test ``Client.request`` (``APIClient`` inherits it)
for every test, so a new test is covered without anyone remembering to. An answer to a
path under ``/api/v1/`` is matched to its operation by path template and method, then:

- its status code must be documented for that operation (no ``default`` answers are
  documented, so an undocumented status fails);
- its ``Content-Type`` must be a documented one, and its body must match the schema
  (openapi-core, the python-openapi project's validator), read strictly: an object of a
  component may hold only the properties the component names (``closed_objects``), so
  an answer with a key the schema does not know fails too;
- its documented headers must be there and match.

Two answers have no operation to match, and are checked here instead: a path under
``/api/v1/`` that matches no template must be a 404 with an ``Error`` body, and a method
the path does not document must be a 405 with an ``Error`` body (or a 401 without an
account: DRF authenticates before it looks at the method). A ``HEAD`` is checked as
the ``GET`` it stands for (status only: it has no body).

A failure names the method, path, status and what did not match. Tests that
deliberately get an answer the schema cannot describe opt out with
``@pytest.mark.no_schema_check(reason=...)``.
"""

from __future__ import annotations

import copy
import json

from django.urls import resolve

API_PREFIX = "/api/v1/"

_openapi = None
_error_validator = None


class SchemaMismatch(AssertionError):
    """An API answer the served OpenAPI schema does not describe."""


def served_schema() -> dict:
    """The schema exactly as ``GET /api/schema/?format=json`` serves it (the project's
    ``SchemaView``, resolved from the URL conf), for an account that may read it. Needs no
    database: the schema is generated from the code."""
    from django.contrib.auth.models import User
    from rest_framework.test import APIRequestFactory, force_authenticate

    request = APIRequestFactory().get("/api/schema/", {"format": "json"})
    force_authenticate(request, user=User(username="schema-reader"))
    match = resolve("/api/schema/")
    response = match.func(request, *match.args, **match.kwargs)
    response.render()
    assert response.status_code == 200, response.content[:500]
    return json.loads(response.content)


def closed_objects(schema: dict) -> dict:
    """A copy of ``schema`` in which every component object that names its properties
    and says nothing of others takes no others (``additionalProperties: false``).

    drf-spectacular leaves objects open (JSON Schema's default); answers are checked
    closed so that a key the schema does not name (a field added to an answer and not to
    its serializer) fails."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node \
                    and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema.get("components", {}))
    return schema


def _load():
    global _openapi, _error_validator
    if _openapi is None:
        from openapi_core import OpenAPI
        from openapi_schema_validator import OAS30Validator
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT4

        schema = closed_objects(served_schema())
        _openapi = OpenAPI.from_dict(schema)
        registry = Registry().with_resource(
            "urn:schema", Resource.from_contents(schema, default_specification=DRAFT4))
        _error_validator = OAS30Validator(
            {"$ref": "urn:schema#/components/schemas/Error"}, registry=registry)
    return _openapi, _error_validator


def _describe(exc: BaseException) -> str:
    """openapi-core's error and, for a body, each schema error with where it is."""
    lines = [f"{type(exc).__name__}: {exc}"]
    seen = exc
    while seen is not None:
        for err in getattr(seen, "schema_errors", None) or ():
            where = "/".join(str(p) for p in err.absolute_path) or "(body)"
            lines.append(f"  at {where}: {err.message}")
        seen = seen.__cause__ or seen.__context__
    return "\n".join(lines)


def _fail(method: str, path: str, status: int, what: str, content: bytes) -> None:
    body = content[:600].decode("utf-8", "replace")
    raise SchemaMismatch(f"{method} {path} answered {status}, which the OpenAPI schema at "
                         f"/api/schema/ does not describe:\n{what}\nbody: {body}")


def _error_body(method, path, status, response) -> None:
    """An answer outside every operation (404 no such path, 405 no such method) must be
    JSON with the ``Error`` shape."""
    _, validator = _load()
    try:
        body = json.loads(response.content)
    except ValueError:
        _fail(method, path, status, "not JSON", response.content)
    errors = list(validator.iter_errors(body))
    if errors:
        _fail(method, path, status, "\n".join(f"  {e.message}" for e in errors),
              response.content)


def _request(django_request):
    """openapi-core's view of the request, without its body: only the answer is checked,
    and a body Django refused to read (``RequestDataTooBig``) must not be read here."""
    from openapi_core.contrib.django import DjangoOpenAPIRequest

    class WithoutBody(DjangoOpenAPIRequest):
        body = b""

    return WithoutBody(django_request)


def check(response) -> None:
    """Raise ``SchemaMismatch`` unless ``response`` (a test client answer to a request
    under ``/api/v1/``) is what the schema documents for its path, method and status."""
    from openapi_core.contrib.django import DjangoOpenAPIResponse
    from openapi_core.templating.paths.exceptions import OperationNotFound, PathNotFound

    openapi, _ = _load()
    request = response.wsgi_request
    method, path, status = request.method, request.path, response.status_code
    head = method == "HEAD"
    if head:
        request.method = "GET"  # a HEAD is the GET without its body
    try:
        openapi.validate_response(_request(request), DjangoOpenAPIResponse(response))
    except PathNotFound:
        if status != 404:
            _fail(method, path, status, "no operation has this path, yet the answer is "
                                        "not a 404", response.content)
        _error_body(method, path, status, response)
    except OperationNotFound:
        if status not in (401, 405):
            _fail(method, path, status, "the path documents no such method, yet the "
                                        "answer is neither a 405 nor a 401", response.content)
        _error_body(method, path, status, response)
    except Exception as exc:  # noqa: BLE001 - every validation error fails the test
        from openapi_core.validation.response.exceptions import MissingData

        if not (head and isinstance(exc, MissingData)):
            _fail(method, path, status, _describe(exc), response.content)
    finally:
        request.method = method


def wants_check(response) -> bool:
    """Whether ``response`` answers a request to the versioned API."""
    request = getattr(response, "wsgi_request", None)
    return request is not None and request.path.startswith(API_PREFIX)
