"""Run the refund graph on one LangGraph thread, checkpointed by the recovery service.

::

    RECOVERY_TOKEN=rcv_... python -m examples.langgraph_refund.run \\
        --base-url http://127.0.0.1:8000 --tenant acme --thread-id refund-LG-2001 \\
        --order-id LG-2001 --amount-cents 2599 --payments-url http://127.0.0.1:8765 \\
        [--crash-in-tool]
    RECOVERY_TOKEN=rcv_... python -m examples.langgraph_refund.run --resume \\
        --base-url http://127.0.0.1:8000 --tenant acme --thread-id refund-LG-2001 \\
        --payments-url http://127.0.0.1:8765

The thread's checkpoints go to the service through ``RecoverySaver`` (``--saver
recovery``, the default; it leases the thread's run for ``--lease-ttl`` seconds and sends
its fencing token), or stay in this process (``--saver memory``: LangGraph's
``InMemorySaver``; effects are still recorded on the service; ``--resume`` then has
nothing to resume). The payment tool's effect is always recorded on the service
(``recovery_client.effects``), in the run of the thread
(``thread_run_id(thread_id)``). Every invocation uses ``durability="sync"``: LangGraph
stores each checkpoint before the next step starts (write-ahead), so the head names the
node a crash interrupted.

``--crash-in-tool``: the process SIGKILLs itself inside the payment tool after the
payment service committed the charge, before the effect is confirmed (the demo workers'
``after_call``). The run is left with its head checkpoint in flight (``charge``, 0/1
tasks written) and the effect ``submitted``; the stale-run sweep makes it ``ambiguous``.

``--resume``: claim the run's resume decision (``POST …/runs/{run_id}/resume``, with the
graph's identity) and obey it. The service's rule for a run in flight is "reject, unless
a reviewer's retry was approved", and this example does not overrule it:

- ``continue`` (stable: the head is between steps) or ``retry`` (a retry a reviewer
  requested and a second person approved, consumed by this claim: effects
  ``unknown``/``not_executed`` are re-planned and called again with the same key):
  re-invoke the graph on the thread (``graph.invoke(None, config)``). LangGraph re-runs
  the node that was interrupted; a confirmed effect is replayed from its receipt by
  ``@recorded_effect`` and never sent twice;
- ``replay`` (the graph completed): execute nothing, print the recorded result;
- ``reconcile`` (an effect is in doubt: reconcile the run first) and every ``reject``
  (``in_flight``: the graph died inside a node and no retry is approved, even once
  reconciliation confirmed its effect; closed, outcome unknown, awaiting approval,
  identity mismatch, ...): do nothing, say why (exit 5).

``--resume --run-id R`` (no ``--thread-id``) learns the thread from the run's checkpoint
(the ``thread_id`` of its ``langgraph.checkpoint`` summary; an audited read): the demo
supervisor knows only run ids. ``--ttl`` is ``--lease-ttl``, as for the demo worker.

Prints a ``{"started": true, ...}`` line, then one JSON result line ``{"outcome", "thread_id",
"run_id", ...}``: ``outcome`` is ``completed`` (with ``status``, ``charge_id``,
``receipt``), ``replayed``, ``not_resumed`` (``action``, ``reason``, ``hint``) or
``refused`` (``error``). Exit status: 0 completed or replayed, 4 refused by the store or
the payment service (e.g. ``EffectInDoubt``), 5 not resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from recovery_client import effects
from recovery_client.client import CheckpointError, EffectFailed, EffectInDoubt, HttpCheckpointStore
from recovery_client.protocol import thread_run_id

from .graph import DEFINITION_VERSION, WORKFLOW, build_graph

# Write-ahead: each checkpoint is stored before the next step runs. LangGraph's default
# ("async") stores it while the next step already runs, so a process killed inside a tool
# may leave the thread's head one or more steps behind (the effect record is written
# either way, but the run would not show which node was running).
DURABILITY = "sync"
EXIT_REFUSED = 4
EXIT_NOT_RESUMED = 5
IDENTITY = {"workflow": WORKFLOW, "definition_version": DEFINITION_VERSION}
# The resume answers on which this example re-invokes the graph (module docstring); on
# ``replay`` it prints the recorded result, on anything else it stops.
GO_ON = {("continue", "stable"), ("retry", "retry_approved")}
NOT_RESUMED_HINTS = {
    "effects_in_doubt": "an effect is still in doubt: reconcile the run first "
                        "(dashboard: Reconcile)",
    "in_flight": "the graph stopped inside a node and no retry is approved: a reviewer "
                 "requests a retry, a second person approves it",
    "outcome_unknown": "an effect's outcome is unknown: approve a retry (accepting a possible "
                       "duplicate) or close the run",
    "awaiting_approval": "a retry is requested but not approved yet",
    "closed": "a reviewer closed the run (handled outside the system)",
    "identity_mismatch": f"the run belongs to another workflow or version than "
                         f"{WORKFLOW} v{DEFINITION_VERSION}",
    "no_checkpoint": "the thread has no checkpoint on the service",
    "unsupported_schema": "its checkpoint's kind or schema version is not supported",
}


def make_saver(args):
    """The checkpointer ``--saver`` names."""
    if args.saver == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        return InMemorySaver()
    from recovery_client.langgraph import RecoverySaver

    # The payment tool's effect writes carry this saver's fencing token
    # (``RecoverySaver.fencing_token``, found by ``@recorded_effect`` in the node's config).
    return RecoverySaver(base_url=args.base_url, tenant=args.tenant, token=args.token,
                         lease_ttl_s=args.lease_ttl, owner=args.owner, timeout_s=args.timeout)


def thread_config(args, *, retry: bool = False) -> dict:
    """The invocation's config: the thread, the run identity, and whether this
    invocation consumed an approved retry (``effects.RETRY_CONFIG_KEY``)."""
    configurable = {"thread_id": args.thread_id, **IDENTITY}
    if retry:
        configurable[effects.RETRY_CONFIG_KEY] = True
    return {"configurable": configurable}


def finished(app, config: dict, result: dict, outcome: str) -> dict:
    """The result line of a thread whose graph ran to its end."""
    values = app.get_state(config).values
    return dict(result, outcome=outcome, status=values.get("status"),
                charge_id=values.get("charge_id"), receipt=values.get("receipt"))


def run(args) -> dict:
    """Start the graph on the thread with the order as input (module docstring)."""
    app = build_graph(args.payments_url, crash_in_tool=args.crash_in_tool).compile(
        checkpointer=make_saver(args))
    config = thread_config(args)
    app.invoke({"order_id": args.order_id, "amount_cents": args.amount_cents}, config,
               durability=DURABILITY)
    return finished(app, config, args.result, "completed")


def resume(args) -> dict:
    """``--resume``: claim the decision, then replay, re-invoke or stop (module docstring)."""
    store = effects.default_store()
    try:
        decision = store.resume(args.run_id, **IDENTITY)
    except CheckpointError as exc:
        if exc.kind != "not_found":
            raise
        decision = {"action": "reject", "reason": "no_checkpoint"}
    action, reason = decision.get("action"), decision.get("reason", "")
    result = dict(args.result, action=action, reason=reason)
    if action != "replay" and (action, reason) not in GO_ON:
        # The service's answer stands: reconcile first, or wait for an approved retry.
        return dict(result, outcome="not_resumed",
                    hint=NOT_RESUMED_HINTS.get(reason, f"the store answered {action} ({reason})"))
    app = build_graph(args.payments_url, crash_in_tool=args.crash_in_tool).compile(
        checkpointer=make_saver(args))
    if action == "replay":  # completed: executes nothing, reads the recorded state
        return finished(app, thread_config(args), result, "replayed")
    config = thread_config(args, retry=action == "retry")
    app.invoke(None, config, durability=DURABILITY)
    return finished(app, config, result, "completed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the LangGraph refund example (module docstring)")
    p.add_argument("--base-url", required=True, help="recovery server, e.g. http://127.0.0.1:8000")
    p.add_argument("--tenant", required=True)
    p.add_argument("--token", default=os.environ.get("RECOVERY_TOKEN"),
                   help="bearer token of a writer (default: $RECOVERY_TOKEN)")
    p.add_argument("--thread-id", default=None,
                   help="the LangGraph thread (one recovery run); required unless --resume "
                        "--run-id")
    p.add_argument("--run-id", default=None,
                   help="with --resume: the thread's run, when the thread id is not at hand "
                        "(learnt from the run's checkpoint)")
    p.add_argument("--order-id", default=None, help="required unless --resume")
    p.add_argument("--amount-cents", type=int, default=2599)
    p.add_argument("--payments-url", default="http://127.0.0.1:8765")
    p.add_argument("--saver", choices=("recovery", "memory"), default="recovery")
    p.add_argument("--lease-ttl", "--ttl", dest="lease_ttl", type=int, default=5,
                   help="the saver's lease, in seconds")
    p.add_argument("--owner", default=None, help="lease owner (default: host:pid:uuid)")
    p.add_argument("--timeout", type=float, default=30, help="HTTP timeout in seconds")
    p.add_argument("--crash-in-tool", action="store_true",
                   help="SIGKILL this process inside the payment tool after the charge "
                        "committed, before the effect is confirmed")
    p.add_argument("--resume", action="store_true",
                   help="claim the thread's resume decision and act on it")
    args = p.parse_args(argv)
    if not args.token:
        p.error("--token or $RECOVERY_TOKEN is required")
    if not args.resume and not args.order_id:
        p.error("--order-id is required (unless --resume)")
    if not args.thread_id and not (args.resume and args.run_id):
        p.error("--thread-id is required (or --resume --run-id)")
    if args.run_id:
        try:
            args.run_id = str(uuid.UUID(args.run_id))
        except ValueError:
            p.error("--run-id: not a UUID")
        if args.thread_id and str(thread_run_id(args.thread_id)) != args.run_id:
            p.error("--run-id is not the run of --thread-id")
    if args.resume and args.saver == "memory":
        p.error("--resume needs --saver recovery (an in-memory saver forgets the thread)")
    return args


def thread_of_run(store: HttpCheckpointStore, run_id: str) -> str | None:
    """The LangGraph thread of ``run_id``: the ``thread_id`` its latest checkpoint names
    (a ``langgraph.checkpoint`` summary), checked against ``thread_run_id``; ``None`` if the
    run has no such checkpoint. The load is an audited payload read."""
    try:
        checkpoint_id = store.resume_preview(run_id).get("checkpoint_id")
    except CheckpointError as exc:
        if exc.kind == "not_found":
            return None
        raise
    envelope = store.load(checkpoint_id) if checkpoint_id else None
    if not envelope or envelope.get("kind") != "langgraph.checkpoint":
        return None
    thread_id = (envelope.get("payload") or {}).get("thread_id")
    if not isinstance(thread_id, str) or str(thread_run_id(thread_id)) != run_id:
        return None
    return thread_id


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    store = HttpCheckpointStore(args.base_url, args.tenant, args.token, timeout_s=args.timeout)
    effects.set_default_store(store)
    args.run_id = args.run_id or str(thread_run_id(args.thread_id))
    args.result = {"thread_id": args.thread_id, "run_id": args.run_id, "pid": os.getpid(),
                   "mode": "resume" if args.resume else "run"}
    # Said first, so that a thread whose process is killed can still be found by its run.
    print(json.dumps({"started": True, **args.result}), flush=True)
    try:
        if args.thread_id is None:
            args.thread_id = args.result["thread_id"] = thread_of_run(store, args.run_id)
        if args.thread_id is None:
            result = dict(args.result, outcome="not_resumed", action="reject",
                          reason="no_checkpoint", hint="the run has no LangGraph checkpoint "
                                                       "naming its thread")
        else:
            result = resume(args) if args.resume else run(args)
    except (CheckpointError, EffectFailed, EffectInDoubt) as exc:
        print(json.dumps(dict(args.result, outcome="refused", error=str(exc))), flush=True)
        print(f"langgraph_refund {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    finally:
        store.close()
    print(json.dumps(result), flush=True)
    if result["outcome"] == "not_resumed":
        print(f"langgraph_refund {os.getpid()}: thread {args.thread_id} not resumed: the store "
              f"answered {result['action']} ({result['reason']}); {result['hint']}. "
              f"Nothing was done.", file=sys.stderr, flush=True)
        return EXIT_NOT_RESUMED
    return 0


if __name__ == "__main__":
    sys.exit(main())
