"""Helpers of the issue-7 matrices: a whole-database snapshot and its difference, so a
"nothing else changed" check cannot miss a table that a narrower snapshot forgot."""

from __future__ import annotations

from django.apps import apps

#: Columns left out of every snapshot: bookkeeping that a request may move without
#: changing any tenant data (``services.token_authenticate``; Django's session store).
IGNORED = {("checkpoints.ApiToken", "last_used_at"), ("auth.User", "last_login")}
SKIPPED_MODELS = {"sessions.Session", "admin.LogEntry"}

Snapshot = dict[str, dict[object, tuple]]


def db_state(ignore: set[tuple[str, str]] = frozenset()) -> Snapshot:
    """Every row of every model (but ``SKIPPED_MODELS``): ``{"app.Model": {pk: (column
    values as text)}}``, without the ``IGNORED`` columns and those in ``ignore``."""
    out: Snapshot = {}
    skip = IGNORED | set(ignore)
    for model in apps.get_models():
        label = model._meta.label
        if label in SKIPPED_MODELS:
            continue
        fields = [f.attname for f in model._meta.concrete_fields if (label, f.name) not in skip]
        pk = model._meta.pk.attname
        rows = model.objects.order_by(pk).values_list(pk, *fields)
        out[label] = {row[0]: tuple(str(v) for v in row[1:]) for row in rows}
    return out


def db_diff(before: Snapshot, after: Snapshot) -> dict[str, dict[str, list]]:
    """``{"app.Model": {"added": [pk], "removed": [pk], "changed": [pk]}}`` for every
    model whose rows differ (empty dict: nothing changed)."""
    out: dict[str, dict[str, list]] = {}
    for label in sorted(set(before) | set(after)):
        b, a = before.get(label, {}), after.get(label, {})
        added = sorted(set(a) - set(b), key=str)
        removed = sorted(set(b) - set(a), key=str)
        changed = sorted((k for k in set(a) & set(b) if a[k] != b[k]), key=str)
        if added or removed or changed:
            out[label] = {k: v for k, v in (("added", added), ("removed", removed),
                                            ("changed", changed)) if v}
    return out


def service_modules() -> list:
    """The modules of the ``checkpoints.services`` package (``services.MODULES``), for the
    matrices that read the services' source to find what they must cover."""
    import importlib

    from checkpoints import services

    return [importlib.import_module(f"checkpoints.services.{name}") for name in services.MODULES]


def is_internal(module) -> bool:
    """Whether ``module`` is one of the services package's ``INTERNAL`` modules, whose
    functions only the services call (the matrices follow their calls, and never count
    them as services)."""
    from checkpoints import services

    return module.__name__ in {f"checkpoints.services.{name}" for name in services.INTERNAL}


def interop_modules() -> list:
    """The modules of the ``checkpoints.interop`` packages (``interop.MODULES``: the
    LangGraph threads and the runifold files, a layer above the services), which the
    matrices read with ``service_modules()``: their operations are audited, lock runs and
    take a tenant like the services'."""
    import importlib

    from checkpoints import interop

    return [importlib.import_module(f"checkpoints.interop.{name}") for name in interop.MODULES]


def public_functions_reaching(modules, roots: set[str], *, attributes: bool = False) -> set[str]:
    """Names of the public top-level functions of ``modules`` that reach one of ``roots``
    (function names) through calls to module functions, transitively; ``roots`` that are
    public count too. With ``attributes``, any attribute read (``qs.select_for_update``)
    counts as a call. The matrices use it to find what they must cover (the audited
    services, the run writers, the locking services) from the code itself."""
    import ast
    import inspect

    calls: dict[str, set[str]] = {}
    public: set[str] = set()
    for module in modules:
        internal = is_internal(module)
        for node in ast.parse(inspect.getsource(module)).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            names = calls.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    f = sub.func
                    names.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
                elif attributes and isinstance(sub, ast.Attribute):
                    names.add(sub.attr)
            if not node.name.startswith("_") and not internal:
                public.add(node.name)
    reached = set(roots)
    grew = True
    while grew:
        grew = False
        for name, called in calls.items():
            if name not in reached and called & reached:
                reached.add(name)
                grew = True
    return public & reached
