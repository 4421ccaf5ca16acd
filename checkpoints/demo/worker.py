"""A demo runtime worker that uses only ``recovery_client.client`` over HTTP (no Django).

Run as its own process::

    RECOVERY_TOKEN=rcv_... python -m checkpoints.demo.worker \\
        --base-url http://127.0.0.1:8000 --tenant acme --shape order \\
        --run-id UUID --checkpoint-id UUID --order-id A-1001 --amount-cents 2599 \\
        --payments-url http://127.0.0.1:8765 [--ttl 5] [--die-at after_call] \\
        [--schema-version 1]
    RECOVERY_TOKEN=rcv_... python -m checkpoints.demo.worker --resume \\
        --base-url http://127.0.0.1:8000 --tenant acme --run-id UUID \\
        --payments-url http://127.0.0.1:8765

Two shapes, each a write-ahead sequence of checkpoint revisions around one effect:

- ``order`` (kind ``acme.order`` v2, ``amount: {"cents", "currency"}``; ``--schema-version
  1`` writes v1's ``amount_cents`` instead, as the code before v2 did): ``ready`` (rev 0)
  -> lease -> ``charging`` (rev 1, in flight) -> effect ``payments`` /
  ``charge:<order_id>`` (non_idempotent): planned -> submitted -> POST /charges with the
  key as Idempotency-Key -> confirmed with the receipt -> ``charged`` (rev 2) ->
  ``completed`` (rev 3). Every revision keeps the run's first version.
- ``agent`` (kind ``runifold.agent`` v1, RUNIFOLD.md section 2): ``ready_for_turn`` (rev 0)
  -> lease -> ``turn_in_flight{turn: 1}`` -> tool effect on ``crm`` (no status lookup, so
  reconciliation answers ``unknown``) with key
  ``{execution_id}:agent:{agent}:turn:1:call:0`` -> ``ready_for_turn`` with the tool call
  and result in the transcript -> ``turn_in_flight{turn: 2}`` -> ``completed{response}``.

``--die-at BOUNDARY`` makes the process SIGKILL itself (no cleanup, no final write) at one
write-ahead boundary of the first turn: ``after_intent`` (in-flight checkpoint written),
``after_submitted`` (effect submitted), ``after_call`` (remote call done, not confirmed),
``after_confirmed`` (effect confirmed, stable checkpoint not written).

``--race-dir DIR --race-parties N``: the worker loads the existing checkpoint (create it
first with ``--create-only``), waits until N workers have loaded it (a file barrier in
DIR), then all try the next revision at once: exactly one wins, the others get a real 412
and exit with status 3. The winner takes the lease only after every party has tried (so a
slow loser meets a stale revision, not a fence), then goes on.

``--resume --run-id R`` (``--checkpoint-id`` optional) finishes an existing run instead,
as a restarted runtime would. It previews the decision (``GET …/resume``, which changes
nothing) to learn the checkpoint, loads it, takes the shape from its ``kind`` and the
order from its payload, then claims the decision (``POST …/resume``, with this worker's
identity: workflow ``acme.order`` v1, or agent ``refund-assistant`` on
``openai/gpt-4.1-mini``):

- ``retry`` (an approved retry, consumed by this claim, the old owner fenced) or
  ``continue`` (stable): take a lease (a new fencing token), reload the checkpoint and
  finish: write the in-flight checkpoint if the run stopped before it, perform the effect
  with ``perform_effect(..., retry=True)`` for a retry (``confirmed`` replays its receipt
  and calls nothing; ``unknown``/``not_executed`` goes planned -> submitted -> the call
  with the same operation key as Idempotency-Key -> confirmed), then write the stable and
  completed revisions.
- ``replay`` (completed): print the recorded outcome, do nothing.
- ``reject`` / ``reconcile``: do nothing, say why and what a person can do (stderr; for
  ``migration_required``, the store's ``detail``: the command that migrates the run).

Prints one JSON line ``{"outcome": ..., "run_id": ...}``; ``outcome`` is ``completed``,
``created``, ``lost_race``, ``replayed``, ``not_resumed`` or ``refused``. Exit status:
0 done (completed, created or replayed), 3 lost a race, 4 refused by the store or the
service (message on stderr), 5 not resumed (the decision was reject or reconcile).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid

from recovery_client.client import (
    CheckpointError,
    EffectFailed,
    EffectInDoubt,
    HttpCheckpointStore,
    next_revision,
    now_ms,
    perform_effect,
)

BOUNDARIES = ("after_intent", "after_submitted", "after_call", "after_confirmed")
EXIT_LOST_RACE = 3
EXIT_REFUSED = 4
EXIT_NOT_RESUMED = 5
AGENT_NAME = "refund-assistant"
MODEL = {"provider": "openai", "name": "gpt-4.1-mini"}


def die() -> None:
    """SIGKILL this process: nothing after this line runs, no handler, no flush but ours."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def post_json(url: str, key: str, body: dict, timeout_s: float = 10) -> dict:
    """POST ``body`` with ``Idempotency-Key: key``; the JSON answer of a 2xx.

    Raises ``EffectFailed`` for a 4xx (the service refused: a definite outcome) and lets
    network errors and 5xx propagate (the outcome is then in doubt).
    """
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            try:
                answer = json.loads(exc.read() or b"{}")
            except ValueError:
                answer = {}
            raise EffectFailed(f"{url}: HTTP {exc.code}", answer if isinstance(answer, dict)
                               else None) from None
        raise


def wait_barrier(directory: str, parties: int, stage: str = "arrived",
                 timeout_s: float = 20) -> None:
    """Block until ``parties`` workers have reached ``stage`` in ``directory`` (one file
    per worker and stage)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{stage}-{os.getpid()}"), "w") as fh:
        fh.write("1")
    deadline = time.monotonic() + timeout_s
    while len([n for n in os.listdir(directory) if n.startswith(f"{stage}-")]) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"race barrier {directory}: fewer than {parties} workers came")
        time.sleep(0.005)


# --- the two shapes ------------------------------------------------------------------------

class Shape:
    """One kind of run: its payloads around one effect, and where a loaded payload stands.

    ``remaining(payload)`` answers what is left to do from a stored payload: ``"start"``
    (stable, before the effect: write the in-flight checkpoint first), ``"effect"`` (in
    flight around the effect: perform it, then ``stabilise``), or the list of payloads
    still to write (empty when the run is complete).
    """

    kind = ""
    service = ""
    #: The schema versions of ``kind`` this worker writes; a new run gets the newest.
    SCHEMA_VERSIONS: tuple[int, ...] = (1,)

    def __init__(self, *, order_id: str, amount_cents: int, payments_url: str,
                 execution_id: str = "", schema_version: int | None = None):
        self.order_id = order_id
        self.amount_cents = amount_cents
        self.payments_url = payments_url.rstrip("/")
        self.execution_id = execution_id
        self.schema_version = schema_version or max(self.SCHEMA_VERSIONS)

    @classmethod
    def from_args(cls, args) -> Shape:
        return cls(order_id=args.order_id, amount_cents=args.amount_cents,
                   payments_url=args.payments_url, execution_id=args.checkpoint_id,
                   schema_version=args.schema_version)

    def _call_args(self) -> dict:
        return {"order_id": self.order_id, "amount_cents": self.amount_cents}


class OrderShape(Shape):
    """``acme.order`` v2 (v1 for a run written by the code before v2, ``--schema-version
    1``): charge the order's card once, then complete."""

    kind = "acme.order"
    service = "payments"
    SCHEMA_VERSIONS = (1, 2)
    WORKFLOW = "acme.order"
    DEFINITION_VERSION = "1"

    @classmethod
    def from_checkpoint(cls, checkpoint: dict, payments_url: str) -> OrderShape:
        """The order of a stored checkpoint: v1's ``amount_cents``, or v2's ``amount:
        {"cents", "currency"}`` (a run the operator migrated, docs/migrations.md; its next
        revisions keep v2, the version read)."""
        p = checkpoint["payload"]
        amount = p.get("amount_cents")
        if checkpoint.get("schema_version") == 2 and isinstance(p.get("amount"), dict):
            amount = p["amount"].get("cents")
        if not isinstance(p.get("order_id"), str) or type(amount) is not int:
            raise ValueError("acme.order payload without order_id and amount_cents "
                             "(v1) or amount.cents (v2)")
        return cls(order_id=p["order_id"], amount_cents=amount,
                   payments_url=payments_url, execution_id=checkpoint["id"],
                   schema_version=checkpoint.get("schema_version"))

    def identity(self) -> dict:
        """The run identity this worker's code implements (sent with ``resume``)."""
        return {"workflow": self.WORKFLOW, "definition_version": self.DEFINITION_VERSION}

    def initial_payload(self) -> dict:
        """Revision 0 in the run's version: v2 ``amount: {"cents", "currency": "USD"}``,
        v1 ``amount_cents`` (the demo's orders are in US dollars)."""
        amount = ({"amount_cents": self.amount_cents} if self.schema_version == 1
                  else {"amount": {"cents": self.amount_cents, "currency": "USD"}})
        return {"phase": "ready", "order_id": self.order_id, "workflow": self.WORKFLOW,
                "definition_version": self.DEFINITION_VERSION, **amount}

    def intent(self, payload: dict) -> dict:
        return dict(payload, phase="charging")

    def effect(self, payload: dict) -> dict:
        return {"service": self.service, "operation_key": f"charge:{self.order_id}",
                "effect_class": "non_idempotent", "request": self._call_args(),
                "url": f"{self.payments_url}/charges"}

    def stabilise(self, payload: dict, receipt: dict) -> list[dict]:
        charged = dict(payload, phase="charged", charge_id=receipt.get("charge_id", ""))
        return [charged, dict(charged, phase="completed")]

    def remaining(self, payload: dict):
        phase = payload.get("phase")
        if phase == "ready":
            return "start"
        if phase == "charging":
            return "effect"
        if phase == "charged":
            return [dict(payload, phase="completed")]
        if phase in ("completed", "cancelled"):
            return []
        raise ValueError(f"acme.order phase {phase!r}: this worker does not resume it")

    def outcome(self, payload: dict) -> dict:
        """What a completed run recorded (a replay shows it, executes nothing)."""
        return {"phase": payload.get("phase"), "charge_id": payload.get("charge_id")}


class AgentShape(Shape):
    """``runifold.agent`` v1: one turn that calls a CRM tool, one that answers.

    The tool call's arguments (order id, amount) ride in the user message's ``metadata``,
    so a resumed worker rebuilds the same request, and so the same fingerprint, from the
    checkpoint alone.
    """

    kind = "runifold.agent"
    service = "crm"

    @classmethod
    def from_checkpoint(cls, checkpoint: dict, payments_url: str) -> AgentShape:
        p = checkpoint["payload"]
        meta = next((m.get("metadata") or {} for m in p.get("transcript", [])
                     if isinstance(m, dict) and m.get("role") == "user"), {})
        if not isinstance(meta.get("order_id"), str) or type(meta.get("amount_cents")) is not int:
            raise ValueError("runifold.agent payload: the user message's metadata has no "
                             "order_id and amount_cents")
        return cls(order_id=meta["order_id"], amount_cents=meta["amount_cents"],
                   payments_url=payments_url, execution_id=p.get("execution_id") or checkpoint["id"])

    def identity(self) -> dict:
        return {"agent": AGENT_NAME, "model": f"{MODEL['provider']}/{MODEL['name']}"}

    def initial_payload(self) -> dict:
        return {
            "execution_id": self.execution_id,
            "agent": AGENT_NAME, "model": MODEL,
            "transcript": [
                _msg("system", "You handle refund requests."),
                _msg("user", f"Please refund order {self.order_id}.",
                     metadata=self._call_args()),
            ],
            "turns": 0, "tool_calls": 0, "delegations": 0,
            "usage": _usage(0, 0, 0, 0),
            "phase": {"state": "ready_for_turn"},
        }

    def intent(self, payload: dict) -> dict:
        return dict(payload, phase={"state": "turn_in_flight", "turn": payload["turns"] + 1})

    def effect(self, payload: dict) -> dict:
        turn = payload["phase"]["turn"]
        key = f"{payload['execution_id']}:agent:{AGENT_NAME}:turn:{turn}:call:0"
        return {"service": self.service, "operation_key": key, "effect_class": "non_idempotent",
                "request": {"tool": "issue_refund", "arguments": self._call_args()},
                "url": f"{self.payments_url}/crm/notes"}

    def stabilise(self, payload: dict, receipt: dict) -> list[dict]:
        args = self._call_args()
        call = {"type": "tool_call", "id": "call_1", "name": "issue_refund", "arguments": args,
                "raw_arguments": json.dumps(args, separators=(",", ":")), "metadata": {}}
        result = {"type": "tool_result", "call_id": "call_1", "name": "issue_refund",
                  "content": [{"type": "text", "text": json.dumps(receipt)}],
                  "structured_content": receipt, "is_error": False, "metadata": {}}
        transcript = [*payload["transcript"],
                      {"role": "assistant", "content": [call], "metadata": {}},
                      {"role": "tool", "content": [result], "metadata": {}}]
        ready = dict(payload, transcript=transcript, turns=1, tool_calls=1,
                     usage=_usage(702, 215, 1, 1), phase={"state": "ready_for_turn"})
        return [ready, *self._tail(ready, receipt)]

    def _tail(self, ready: dict, receipt: dict) -> list[dict]:
        """Turn 2 (no tool): in flight, then completed with the answer."""
        in_flight = dict(ready, phase={"state": "turn_in_flight", "turn": 2})
        return [in_flight, self._done(ready, receipt)]

    def _done(self, ready: dict, receipt: dict) -> dict:
        answer = f"Refund for order {self.order_id} issued ({receipt.get('charge_id')})."
        response = {
            "id": f"resp_{uuid.uuid4().hex[:8]}", "model": MODEL,
            "content": [{"type": "text", "text": answer}], "finish_reason": "stop",
            "usage": {"input_tokens": 80, "output_tokens": 20, "reasoning_tokens": 0,
                      "cached_input_tokens": 0, "cache_write_tokens": 0, "cost_microusd": 30},
            "warnings": [], "provider_metadata": {}, "provider_events": [],
        }
        return dict(ready, transcript=[*ready["transcript"], _msg("assistant", answer)],
                    turns=2, usage=_usage(802, 245, 2, 1),
                    phase={"state": "completed", "response": response})

    @staticmethod
    def _recorded_receipt(payload: dict) -> dict:
        """The tool result turn 1 recorded in the transcript."""
        for message in payload.get("transcript", []):
            for part in message.get("content", []) if isinstance(message, dict) else []:
                if isinstance(part, dict) and part.get("type") == "tool_result":
                    return part.get("structured_content") or {}
        return {}

    def remaining(self, payload: dict):
        phase = payload.get("phase") or {}
        state, turns = phase.get("state"), payload.get("turns", 0)
        if state == "completed":
            return []
        if state == "ready_for_turn":
            if turns == 0:
                return "start"
            return self._tail(payload, self._recorded_receipt(payload))
        if state == "turn_in_flight" and phase.get("turn") == 1:
            return "effect"
        if state == "turn_in_flight" and phase.get("turn") == 2:
            return [self._done(payload, self._recorded_receipt(payload))]
        raise ValueError(f"runifold.agent phase {phase!r}: this worker does not resume it")

    def outcome(self, payload: dict) -> dict:
        response = (payload.get("phase") or {}).get("response") or {}
        text = " ".join(part.get("text", "") for part in response.get("content", [])
                        if isinstance(part, dict))
        return {"phase": (payload.get("phase") or {}).get("state"), "response": text}


def _msg(role: str, text: str, metadata: dict | None = None) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}],
            "metadata": metadata or {}}


def _usage(tokens: int, cost: int, turns: int, tool_calls: int) -> dict:
    return {"tokens": tokens, "cost_microusd": cost, "duration_micros": 0, "turns": turns,
            "tool_calls": tool_calls, "delegations": 0}


SHAPES = {"order": OrderShape, "agent": AgentShape}
SHAPE_OF_KIND = {cls.kind: name for name, cls in SHAPES.items()}


# --- the worker ----------------------------------------------------------------------------

def _die_on(args):
    boundary = {"submitted": "after_submitted", "called": "after_call",
                "confirmed": "after_confirmed"}

    def on_step(name: str) -> None:
        if boundary.get(name) == args.die_at:
            die()

    return on_step


def drive(store: HttpCheckpointStore, shape: Shape, checkpoint: dict, args, *,
          retry: bool = False) -> tuple[dict, dict | None]:
    """Take the run from ``checkpoint`` (its latest revision, this process the owner) to
    completed: write the in-flight checkpoint if it is still stable before the effect,
    perform the effect (``retry``: re-plan an ``unknown``/``not_executed`` one; a
    ``confirmed`` one replays its receipt), then write the stable and completed revisions.
    Returns the last checkpoint written and the effect's receipt (``None`` if the effect
    was already behind the checkpoint)."""
    todo = shape.remaining(checkpoint["payload"])
    receipt = None
    if todo == "start":
        intent = next_revision(checkpoint, shape.intent(checkpoint["payload"]))
        store.compare_and_swap(intent, checkpoint["revision"])
        checkpoint = intent
        if args.die_at == "after_intent":
            die()
        todo = "effect"
    if todo == "effect":
        spec = shape.effect(checkpoint["payload"])
        receipt = perform_effect(
            store, run_id=checkpoint["run_id"], service=spec["service"],
            operation_key=spec["operation_key"], effect_class=spec["effect_class"],
            request=spec["request"], call=lambda key: post_json(spec["url"], key, spec["request"]),
            on_step=_die_on(args), retry=retry,
        )
        todo = shape.stabilise(checkpoint["payload"], receipt)
    for payload in todo:
        nxt = next_revision(checkpoint, payload)
        store.compare_and_swap(nxt, checkpoint["revision"])
        checkpoint = nxt
    return checkpoint, receipt


def run(args) -> dict:
    """Drive one run to completion (or to ``--die-at``); returns the result line."""
    store = HttpCheckpointStore(args.base_url, args.tenant, args.token, timeout_s=args.timeout)
    shape = SHAPES[args.shape].from_args(args)
    owner = args.owner or f"{args.shape}-worker-{os.getpid()}"
    result = {"run_id": args.run_id, "checkpoint_id": args.checkpoint_id, "owner": owner,
              "pid": os.getpid()}
    # Said first, so that a run whose worker is killed can still be found by its id.
    print(json.dumps({"started": True, **result}), flush=True)

    checkpoint = store.load(args.checkpoint_id)
    if checkpoint is None:
        checkpoint = {"id": args.checkpoint_id, "run_id": args.run_id, "revision": 0,
                      "kind": shape.kind, "schema_version": shape.schema_version,
                      "payload": shape.initial_payload(), "updated_at_ms": now_ms()}
        store.compare_and_swap(checkpoint, None)
    if args.create_only:
        return dict(result, outcome="created", revision=checkpoint["revision"])

    intent = next_revision(checkpoint, shape.intent(checkpoint["payload"]))
    if args.race_dir:
        # Everyone has loaded the same revision; now all try revision + 1 at once.
        wait_barrier(args.race_dir, args.race_parties)
        try:
            store.compare_and_swap(intent, checkpoint["revision"])
        except CheckpointError as exc:
            if exc.kind == "conflict":
                wait_barrier(args.race_dir, args.race_parties, stage="tried")
                return dict(result, outcome="lost_race", status=exc.status,
                            error=exc.error, current_revision=exc.current_revision)
            raise
        # The winner leases only once every party has tried: a lease taken earlier would
        # make a slower loser's write fenced (409) instead of a stale revision (412).
        wait_barrier(args.race_dir, args.race_parties, stage="tried")
        store.lease(args.run_id, owner, args.ttl)
    else:
        store.lease(args.run_id, owner, args.ttl)
        store.compare_and_swap(intent, checkpoint["revision"])
    checkpoint = intent
    if args.die_at == "after_intent":
        die()

    checkpoint, receipt = drive(store, shape, checkpoint, args)
    return dict(result, outcome="completed", revision=checkpoint["revision"],
                receipt=receipt)


# Why a resume did nothing, and what a person can do about it (printed on stderr).
NOT_RESUMED_HINTS = {
    "reconcile": "an effect is still in doubt: reconcile the run first (dashboard: Reconcile)",
    "in_flight": "its latest checkpoint is in flight and no retry is approved: a reviewer "
                 "requests a retry, a second person approves it",
    "outcome_unknown": "an effect's outcome is unknown: approve a retry (accepting a possible "
                       "duplicate) or close the run",
    "awaiting_approval": "a retry is requested but not approved yet",
    "closed": "a reviewer closed the run (handled outside the system)",
    "identity_mismatch": "the run belongs to another agent, model or workflow version than "
                         "this worker's",
    "unsupported_schema": "its checkpoint's kind or schema version is not supported",
    "no_checkpoint": "the run has no checkpoint to resume from",
    "migration_required": "its checkpoint is an older version of a kind the store migrates "
                          "offline: the tenant's admin migrates it (manage.py "
                          "migrate_checkpoints KIND --to N, or the Kinds page), then it "
                          "resumes",
    "unsupported_kind": f"this worker resumes only {', '.join(sorted(SHAPE_OF_KIND))} runs",
}


def resume(args) -> dict:
    """``--resume``: claim the run's resume decision and act on it (module docstring)."""
    store = HttpCheckpointStore(args.base_url, args.tenant, args.token, timeout_s=args.timeout)
    owner = args.owner or f"resume-worker-{os.getpid()}"
    result = {"run_id": args.run_id, "owner": owner, "pid": os.getpid(), "mode": "resume"}

    def not_resumed(action: str, reason: str, detail: str = "") -> dict:
        return dict(result, outcome="not_resumed", action=action, reason=reason,
                    hint=detail or NOT_RESUMED_HINTS.get(reason)
                    or NOT_RESUMED_HINTS.get(action) or f"the store answered {action} ({reason})")

    # Look first (changes nothing) to learn the checkpoint, so the shape, the order and
    # this worker's identity come from the stored payload, not from the command line.
    preview = store.resume_preview(args.run_id)
    checkpoint_id = args.checkpoint_id or preview.get("checkpoint_id")
    if not checkpoint_id:
        return not_resumed(preview.get("action", "reject"), "no_checkpoint")
    checkpoint = store.load(checkpoint_id)
    if checkpoint is None or checkpoint.get("run_id") != args.run_id:
        return not_resumed("reject", "no_checkpoint")
    name = SHAPE_OF_KIND.get(checkpoint.get("kind"))
    if name is None:
        return not_resumed("reject", "unsupported_kind")
    shape = SHAPES[name].from_checkpoint(checkpoint, args.payments_url)
    result.update(shape=name, checkpoint_id=checkpoint_id)

    decision = store.resume(args.run_id, **shape.identity())  # the claim
    action, reason = decision.get("action"), decision.get("reason", "")
    result.update(action=action, reason=reason)
    if action == "replay":
        latest = store.load(checkpoint_id) or checkpoint
        return dict(result, outcome="replayed", revision=latest["revision"],
                    recorded=shape.outcome(latest["payload"]))
    if action not in ("retry", "continue"):
        # The store's own words when it has them (migration_required: the command).
        return not_resumed(action, reason, str(decision.get("detail") or ""))
    # Ours now (retry: the old owner is fenced). A lease makes that visible, keeps the
    # sweep away while we work, and gives this process its own, newer fencing token.
    store.lease(args.run_id, owner, args.ttl)
    checkpoint = store.load(checkpoint_id)
    if checkpoint is None:
        return not_resumed(action, "no_checkpoint")
    checkpoint, receipt = drive(store, shape, checkpoint, args, retry=action == "retry")
    return dict(result, outcome="completed", revision=checkpoint["revision"],
                receipt=receipt, fencing_token=store.fencing_token)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="demo runtime worker (recovery_client.client only)")
    p.add_argument("--base-url", required=True, help="recovery server, e.g. http://127.0.0.1:8000")
    p.add_argument("--tenant", required=True)
    p.add_argument("--token", default=os.environ.get("RECOVERY_TOKEN"),
                   help="bearer token of a writer (default: $RECOVERY_TOKEN)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="order")
    p.add_argument("--run-id", default=None)
    p.add_argument("--checkpoint-id", default=None)
    p.add_argument("--order-id", default="A-1000")
    p.add_argument("--amount-cents", type=int, default=2599)
    p.add_argument("--payments-url", default="http://127.0.0.1:8765")
    p.add_argument("--ttl", type=int, default=5, help="lease ttl in seconds")
    p.add_argument("--owner", default=None)
    p.add_argument("--timeout", type=float, default=30, help="HTTP timeout in seconds")
    p.add_argument("--die-at", choices=BOUNDARIES, default=None)
    p.add_argument("--schema-version", type=int, choices=OrderShape.SCHEMA_VERSIONS,
                   default=None,
                   help="acme.order version of a new order run (default: the newest, 2; 1 "
                        "writes a run as the code before v2 did)")
    p.add_argument("--create-only", action="store_true",
                   help="write revision 0 and exit (to set up a race)")
    p.add_argument("--race-dir", default=None)
    p.add_argument("--race-parties", type=int, default=2)
    p.add_argument("--resume", action="store_true",
                   help="resume the existing run --run-id: claim the resume decision and act "
                        "on it (shape and order come from its checkpoint)")
    args = p.parse_args(argv)
    if not args.token:
        p.error("--token or $RECOVERY_TOKEN is required")
    if args.resume and not args.run_id:
        p.error("--resume needs --run-id")
    if args.resume and (args.create_only or args.race_dir or args.schema_version):
        p.error("--resume cannot be combined with --create-only, --race-dir or "
                "--schema-version (a resumed run keeps its checkpoint's version)")
    if args.schema_version and args.shape != "order":
        p.error("--schema-version is for --shape order (runifold.agent is v1)")
    args.run_id = str(uuid.UUID(args.run_id)) if args.run_id else str(uuid.uuid4())
    if args.checkpoint_id:
        args.checkpoint_id = str(uuid.UUID(args.checkpoint_id))
    elif not args.resume:  # a resume learns it from the store
        args.checkpoint_id = str(uuid.uuid4())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = resume(args) if args.resume else run(args)
    except (CheckpointError, EffectFailed, EffectInDoubt, TimeoutError, ValueError) as exc:
        print(json.dumps({"run_id": args.run_id, "outcome": "refused", "error": str(exc)}),
              flush=True)
        print(f"worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    print(json.dumps(result), flush=True)
    if result["outcome"] == "not_resumed":
        print(f"worker {os.getpid()}: run {args.run_id} not resumed: the store answered "
              f"{result['action']} ({result['reason']}); {result['hint']}. Nothing was done.",
              file=sys.stderr, flush=True)
        return EXIT_NOT_RESUMED
    return EXIT_LOST_RACE if result["outcome"] == "lost_race" else 0


if __name__ == "__main__":
    sys.exit(main())
