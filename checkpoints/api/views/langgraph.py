"""The LangGraph thread API (issue 10, docs/langgraph.md): checkpoints, pending
writes, and the thread operations (delete, copy, prune, delete for runs)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from ... import roles
from ...exceptions import InvalidPayload
from ...interop import langgraph
from ...models import Tenant
from .. import params as p
from .. import serializers as s
from .common import (
    CAS_HEADERS,
    FENCED,
    TENANT,
    TenantApi,
    _errors,
    _only_fields,
    parse_fencing_token,
    read_object,
)

THREAD_CONFLICT = OpenApiResponse(
    s.ThreadConflictSerializer,
    description="conflict: the parent is not the head of the thread's namespace, the id "
                "holds other content, or the id does not sort after the head's; kept as a "
                "conflict of the thread's run")
LG = "LangGraph (writer): "


def _thread_list(body: dict, key: str, limit: int, check) -> list[str]:
    values = body.get(key)
    if not isinstance(values, list) or len(values) > limit:
        raise InvalidPayload(f"{key}: must be an array of at most {limit} strings")
    return [check(value, f"{key}[{i}]") for i, value in enumerate(values)]


class LangGraphCheckpointsApi(TenantApi):
    """``…/langgraph/checkpoints``: store one LangGraph checkpoint (POST, ``put``), or
    read them newest first (GET, ``get_tuple`` and ``list``)."""

    params = {"get": p.LangGraphListParams}

    def _list_args(self) -> dict:
        """The checked query parameters as ``graph_list`` takes them (400 naming one)."""
        q = self.query
        lg = langgraph
        return dict(
            thread_id=None if q["thread_id"] is None else lg.check_thread_id(q["thread_id"]),
            checkpoint_ns=None if q["checkpoint_ns"] is None else lg.check_ns(q["checkpoint_ns"]),
            checkpoint_id=(None if q["checkpoint_id"] is None
                           else lg.check_checkpoint_id(q["checkpoint_id"])),
            before=None if q["before"] is None else lg.check_checkpoint_id(q["before"], "before"),
            limit=q["limit"], metadata_filter=langgraph.parse_filter(q["filter"]))

    @extend_schema(
        operation_id="langgraph_checkpoint_list",
        summary=LG + "LangGraph checkpoints with their pending writes, newest first "
                     "(payload read, audited once per thread namespace)",
        parameters=[TENANT, p.LangGraphListParams],
        responses={200: s.GraphPageSerializer, **_errors(400, 410)},
    )
    def get(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        results, next_before = langgraph.graph_list(actor=request.user, tenant=t,
                                                   **self._list_args())
        return Response(s.GraphPageSerializer.render({"results": results,
                                                      "next_before": next_before}))

    def head(self, request, tenant):
        """The GET's status without its body: the same role and the same 400s for its
        parameters, but nothing is read, so nothing is audited or written (as
        ``CheckpointApi.head``; issue 10). Documented by ``schema.head_operations``."""
        self.tenant(request, tenant, roles.WRITE)
        self._list_args()
        return Response()

    @extend_schema(
        operation_id="langgraph_checkpoint_put",
        summary=LG + "store one LangGraph checkpoint (compare-and-swap on the thread "
                     "namespace's head)",
        parameters=[TENANT, CAS_HEADERS[2]],
        request=s.GraphPutInputSerializer,
        responses={201: OpenApiResponse(s.GraphPutSerializer, description="stored"),
                   200: OpenApiResponse(s.GraphPutSerializer,
                                        description="the same checkpoint again (a retry): "
                                                    "the first answer, nothing written"),
                   **_errors(400, 413), 409: FENCED, 412: THREAD_CONFLICT},
    )
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        token = parse_fencing_token(request)
        put = langgraph.parse_put(read_object(request))
        answer, created = langgraph.graph_put(actor=request.user, tenant=t, put=put,
                                             fencing_token=token)
        return Response(s.GraphPutSerializer.render(answer),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _lg_operation(operation_id: str, summary: str, request, answer, *, fenced: bool = False,
                  more: dict | None = None):
    """``extend_schema`` of a LangGraph write that POSTs a JSON body: ``request`` (its
    serializer) in, 200 ``answer`` out, the errors of every body (``_errors(400, 413)``)
    and ``more`` (status -> response). ``fenced``: it also takes ``Fencing-Token`` and may
    answer 409 ``fenced``. ``summary`` follows the tag ``LG``."""
    responses = {200: answer, **_errors(400, 413)}
    if fenced:
        responses[409] = FENCED
    return extend_schema(operation_id=operation_id, summary=LG + summary,
                         parameters=[TENANT, CAS_HEADERS[2]] if fenced else [TENANT],
                         request=request, responses={**responses, **(more or {})})


# Base of the LangGraph thread operations (delete, copy, prune, delete for runs): a writer
# POSTs one JSON object holding ``fields`` only (``writer_body``), one service call
# answers. No docstring on purpose: the schema describes an operation by its view's
# docstring, inherited, and these keep ``TenantApi``'s.
class _LangGraphThreadsApi(TenantApi):
    #: The fields the body may hold; any other is 400 naming it.
    fields: frozenset[str] = frozenset()

    def writer_body(self, request: Request, slug: str) -> tuple[Tenant, dict]:
        """The tenant (``WRITE`` right: 403 without) and the body, a JSON object with
        ``fields`` only (``read_object``'s 400/411/413/415, then 400 naming an unknown
        field)."""
        t = self.tenant(request, slug, roles.WRITE)
        body = read_object(request)
        _only_fields(body, self.fields)
        return t, body


class LangGraphWritesApi(TenantApi):
    @_lg_operation("langgraph_writes_put",
                   "store a task's pending writes on a checkpoint (put_writes)",
                   s.GraphWritesInputSerializer, s.StoredSerializer, fenced=True)
    def post(self, request, tenant):
        t = self.tenant(request, tenant, roles.WRITE)
        token = parse_fencing_token(request)
        body = langgraph.parse_writes(read_object(request))
        stored = langgraph.graph_put_writes(actor=request.user, tenant=t, body=body,
                                           fencing_token=token)
        return Response(s.StoredSerializer.render({"stored": stored}))


class LangGraphThreadDeleteApi(_LangGraphThreadsApi):
    fields = frozenset({"thread_id"})

    @_lg_operation("langgraph_thread_delete",
                   "delete a thread's checkpoints and pending writes (delete_thread); "
                   "effects stay", s.ThreadInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        thread_id = langgraph.check_thread_id(body.get("thread_id"))
        deleted = langgraph.graph_thread_delete(actor=request.user, tenant=t,
                                               thread_id=thread_id)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))


class LangGraphThreadCopyApi(_LangGraphThreadsApi):
    fields = frozenset({"source_thread_id", "target_thread_id"})

    @_lg_operation("langgraph_thread_copy",
                   "copy a thread's checkpoints and pending writes onto an empty thread "
                   "(copy_thread)", s.ThreadCopyInputSerializer, s.CopiedSerializer,
                   more={412: THREAD_CONFLICT})
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        check = langgraph.check_thread_id
        source = check(body.get("source_thread_id"), "source_thread_id")
        target = check(body.get("target_thread_id"), "target_thread_id")
        copied = langgraph.graph_thread_copy(actor=request.user, tenant=t,
                                            source_thread_id=source, target_thread_id=target)
        return Response(s.CopiedSerializer.render({"copied": copied}))


class LangGraphThreadPruneApi(_LangGraphThreadsApi):
    fields = frozenset({"thread_ids", "strategy"})

    @_lg_operation("langgraph_thread_prune",
                   "prune threads: keep each namespace's newest checkpoint, or delete "
                   "them (prune)", s.ThreadPruneInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        threads = _thread_list(body, "thread_ids", 1000, langgraph.check_thread_id)
        strategy = body.get("strategy")
        if strategy not in langgraph.PRUNE_STRATEGIES:
            raise InvalidPayload("strategy: must be keep_latest or delete")
        deleted = langgraph.graph_threads_prune(actor=request.user, tenant=t,
                                               thread_ids=threads, strategy=strategy)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))


class LangGraphRunsDeleteApi(_LangGraphThreadsApi):
    fields = frozenset({"run_ids"})

    @_lg_operation("langgraph_runs_delete",
                   "delete the checkpoints of LangGraph runs (delete_for_runs)",
                   s.RunsDeleteInputSerializer, s.DeletedSerializer)
    def post(self, request, tenant):
        t, body = self.writer_body(request, tenant)
        run_ids = _thread_list(body, "run_ids", 1000, langgraph.check_lg_run_id)
        deleted = langgraph.graph_runs_delete(actor=request.user, tenant=t, run_ids=run_ids)
        return Response(s.DeletedSerializer.render({"deleted": deleted}))
