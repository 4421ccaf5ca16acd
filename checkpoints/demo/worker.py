"""A demo runtime worker that uses only ``checkpoints.client`` over HTTP (no Django).

Run as its own process::

    RECOVERY_TOKEN=rcv_... python -m checkpoints.demo.worker \\
        --base-url http://127.0.0.1:8000 --tenant acme --shape order \\
        --run-id UUID --checkpoint-id UUID --order-id A-1001 --amount-cents 2599 \\
        --payments-url http://127.0.0.1:8765 [--ttl 5] [--die-at after_call]

Two shapes, each a write-ahead sequence of checkpoint revisions around one effect:

- ``order`` (kind ``acme.order`` v1): ``ready`` (rev 0) -> lease -> ``charging`` (rev 1,
  in flight) -> effect ``payments`` / ``charge:<order_id>`` (non_idempotent):
  planned -> submitted -> POST /charges with the key as Idempotency-Key -> confirmed with
  the receipt -> ``charged`` (rev 2) -> ``completed`` (rev 3).
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

Prints one JSON line ``{"outcome": ..., "run_id": ...}``. Exit status: 0 done, 3 lost a
race, 4 refused by the store or the service (message on stderr).
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

from checkpoints.client import (
    CheckpointError,
    EffectFailed,
    HttpCheckpointStore,
    next_revision,
    now_ms,
    perform_effect,
)

BOUNDARIES = ("after_intent", "after_submitted", "after_call", "after_confirmed")
EXIT_LOST_RACE = 3
EXIT_REFUSED = 4
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

class OrderShape:
    """``acme.order`` v1: charge the order's card once, then complete."""

    kind = "acme.order"
    service = "payments"

    def __init__(self, args):
        self.args = args

    def initial_payload(self) -> dict:
        return {"phase": "ready", "order_id": self.args.order_id, "workflow": "acme.order",
                "definition_version": "1", "amount_cents": self.args.amount_cents}

    def intent(self, payload: dict) -> dict:
        return dict(payload, phase="charging")

    def effect(self, payload: dict) -> dict:
        request = {"order_id": self.args.order_id, "amount_cents": self.args.amount_cents}
        return {"service": self.service, "operation_key": f"charge:{self.args.order_id}",
                "effect_class": "non_idempotent", "request": request,
                "url": f"{self.args.payments_url.rstrip('/')}/charges"}

    def stabilise(self, payload: dict, receipt: dict) -> list[dict]:
        charged = dict(payload, phase="charged", charge_id=receipt.get("charge_id", ""))
        return [charged, dict(charged, phase="completed")]


class AgentShape:
    """``runifold.agent`` v1: one turn that calls a CRM tool, one that answers."""

    kind = "runifold.agent"
    service = "crm"

    def __init__(self, args):
        self.args = args

    def initial_payload(self) -> dict:
        return {
            "execution_id": self.args.checkpoint_id,
            "agent": AGENT_NAME, "model": MODEL,
            "transcript": [
                _msg("system", "You handle refund requests."),
                _msg("user", f"Please refund order {self.args.order_id}."),
            ],
            "turns": 0, "tool_calls": 0, "delegations": 0,
            "usage": _usage(0, 0, 0, 0),
            "phase": {"state": "ready_for_turn"},
        }

    def intent(self, payload: dict) -> dict:
        return dict(payload, phase={"state": "turn_in_flight", "turn": payload["turns"] + 1})

    def _call_args(self) -> dict:
        return {"order_id": self.args.order_id, "amount_cents": self.args.amount_cents}

    def effect(self, payload: dict) -> dict:
        turn = payload["phase"]["turn"]
        key = f"{payload['execution_id']}:agent:{AGENT_NAME}:turn:{turn}:call:0"
        return {"service": self.service, "operation_key": key, "effect_class": "non_idempotent",
                "request": {"tool": "issue_refund", "arguments": self._call_args()},
                "url": f"{self.args.payments_url.rstrip('/')}/crm/notes"}

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
        in_flight = dict(ready, phase={"state": "turn_in_flight", "turn": 2})
        answer = f"Refund for order {self.args.order_id} issued ({receipt.get('charge_id')})."
        response = {
            "id": f"resp_{uuid.uuid4().hex[:8]}", "model": MODEL,
            "content": [{"type": "text", "text": answer}], "finish_reason": "stop",
            "usage": {"input_tokens": 80, "output_tokens": 20, "reasoning_tokens": 0,
                      "cached_input_tokens": 0, "cache_write_tokens": 0, "cost_microusd": 30},
            "warnings": [], "provider_metadata": {}, "provider_events": [],
        }
        done = dict(ready, transcript=[*transcript, _msg("assistant", answer)], turns=2,
                    usage=_usage(802, 245, 2, 1), phase={"state": "completed",
                                                         "response": response})
        return [ready, in_flight, done]


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}], "metadata": {}}


def _usage(tokens: int, cost: int, turns: int, tool_calls: int) -> dict:
    return {"tokens": tokens, "cost_microusd": cost, "duration_micros": 0, "turns": turns,
            "tool_calls": tool_calls, "delegations": 0}


SHAPES = {"order": OrderShape, "agent": AgentShape}


# --- the worker ----------------------------------------------------------------------------

def run(args) -> dict:
    """Drive one run to completion (or to ``--die-at``); returns the result line."""
    store = HttpCheckpointStore(args.base_url, args.tenant, args.token, timeout_s=args.timeout)
    shape = SHAPES[args.shape](args)
    owner = args.owner or f"{args.shape}-worker-{os.getpid()}"
    result = {"run_id": args.run_id, "checkpoint_id": args.checkpoint_id, "owner": owner,
              "pid": os.getpid()}

    checkpoint = store.load(args.checkpoint_id)
    if checkpoint is None:
        checkpoint = {"id": args.checkpoint_id, "run_id": args.run_id, "revision": 0,
                      "kind": shape.kind, "schema_version": 1,
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

    spec = shape.effect(checkpoint["payload"])
    boundary = {"submitted": "after_submitted", "called": "after_call",
                "confirmed": "after_confirmed"}

    def on_step(name: str) -> None:
        if boundary.get(name) == args.die_at:
            die()

    receipt = perform_effect(
        store, run_id=args.run_id, service=spec["service"], operation_key=spec["operation_key"],
        effect_class=spec["effect_class"], request=spec["request"],
        call=lambda key: post_json(spec["url"], key, spec["request"]), on_step=on_step,
    )
    for payload in shape.stabilise(checkpoint["payload"], receipt):
        nxt = next_revision(checkpoint, payload)
        store.compare_and_swap(nxt, checkpoint["revision"])
        checkpoint = nxt
    return dict(result, outcome="completed", revision=checkpoint["revision"],
                receipt=receipt)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="demo runtime worker (checkpoints.client only)")
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
    p.add_argument("--create-only", action="store_true",
                   help="write revision 0 and exit (to set up a race)")
    p.add_argument("--race-dir", default=None)
    p.add_argument("--race-parties", type=int, default=2)
    args = p.parse_args(argv)
    if not args.token:
        p.error("--token or $RECOVERY_TOKEN is required")
    args.run_id = str(uuid.UUID(args.run_id)) if args.run_id else str(uuid.uuid4())
    args.checkpoint_id = (str(uuid.UUID(args.checkpoint_id)) if args.checkpoint_id
                          else str(uuid.uuid4()))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except (CheckpointError, EffectFailed, TimeoutError) as exc:
        print(json.dumps({"run_id": args.run_id, "outcome": "refused", "error": str(exc)}),
              flush=True)
        print(f"worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    print(json.dumps(result), flush=True)
    return EXIT_LOST_RACE if result["outcome"] == "lost_race" else 0


if __name__ == "__main__":
    sys.exit(main())
