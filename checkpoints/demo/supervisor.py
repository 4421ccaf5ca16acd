"""Resume runs whose retry was approved, so the demo finishes them by itself (stdlib only).

What a runtime's supervisor does in production, small: every ``--interval`` seconds (3),
for each tenant, list the runs in ``retry_approved`` through the API with the tenant's
writer token (``GET …/runs?recovery_state=retry_approved``) and start one
``python -m checkpoints.demo.worker --resume --run-id R`` process per run (for a run of
kind ``langgraph.checkpoint``: ``python -m examples.langgraph_refund.run --resume
--run-id R``, which re-invokes the LangGraph refund graph on the run's thread). A
reviewer who got a retry approved in the dashboard then sees the run complete without a
terminal.

- Never two workers for the same run at once: a run with a live worker is skipped. (If
  two supervisors ran anyway, only one claim consumes the approval; the other worker is
  answered ``reject`` and does nothing.)
- A worker that ends without finishing (not resumed, refused, killed) is tried again
  after ``--backoff`` seconds (30), at most ``--attempts`` times (3) per run while the
  supervisor lives; a run that stays ``retry_approved`` after that is left to a person.
- Except a run the store answers ``reject`` / ``migration_required`` (an older version
  of a kind that migrates offline, ``RECOVERY_OFFLINE_KINDS``): that is not an attempt,
  the run waits for a person to migrate it, never given up on. It is tried again as soon
  as a pass lists it at another schema version than the one refused (migrated: within
  ``--interval`` seconds), else after ``MIGRATION_RECHECK_S`` (600 s, or the back-off if
  longer: in case the server's kinds changed; each try is an audited payload read).
- One line per finished resume in the log (``var/demo-supervisor.log`` in the demo):
  time, tenant, run, exit status, outcome, action/reason, revision or error.

Run it::

    RECOVERY_TOKENS=acme=rcv_...,globex=rcv_... python -m checkpoints.demo.supervisor \\
        --base-url http://127.0.0.1:8000 --payments-url http://127.0.0.1:8765 \\
        --log var/demo-supervisor.log

Tokens come from ``$RECOVERY_TOKENS`` (``tenant=token,...``), never the command line;
each worker gets its tenant's token in ``$RECOVERY_TOKEN``. SIGTERM or Ctrl-C stops it:
workers still running get a few seconds to finish, then are terminated.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from recovery_client.client import CheckpointError, HttpCheckpointStore

# The module that resumes a run of a kind (``python -m MODULE --resume ...``); any other
# kind goes to the demo worker, which says which kinds it resumes.
RESUMER_OF_KIND = {"langgraph.checkpoint": "examples.langgraph_refund.run"}
WORKER = "checkpoints.demo.worker"


#: Seconds before a run answered ``migration_required`` is tried again at the same
#: schema version (at another one, the next pass tries it at once).
MIGRATION_RECHECK_S = 600


@dataclass
class Resume:
    """One worker process resuming one run."""

    tenant: str
    run_id: str
    proc: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    schema_version: int | None = None  # the run's, as listed when the worker started


def parse_tokens(text: str) -> dict[str, str]:
    """``"acme=rcv_a,globex=rcv_b"`` -> ``{"acme": "rcv_a", "globex": "rcv_b"}``."""
    tokens: dict[str, str] = {}
    for pair in (text or "").split(","):
        tenant, sep, token = pair.strip().partition("=")
        if sep and tenant.strip() and token.strip():
            tokens[tenant.strip()] = token.strip()
    return tokens


class Supervisor:
    """Starts and reaps resume workers; ``tick()`` is one pass, ``serve()`` the loop.

    ``tokens`` maps tenant slug -> writer token. ``log_path`` gets one line per ended
    resume (also returned by ``tick``). ``worker_args`` are extra arguments for every
    worker (e.g. ``["--ttl", "1"]``).
    """

    def __init__(self, *, base_url: str, payments_url: str, tokens: dict[str, str],
                 log_path: str | os.PathLike, cwd: str | None = None, backoff_s: float = 30,
                 max_attempts: int = 3, worker_args: list[str] | None = None,
                 python: str = sys.executable, timeout_s: float = 10):
        self.base_url = base_url
        self.payments_url = payments_url
        self.tokens = dict(tokens)
        self.log_path = os.fspath(log_path)
        self.cwd = cwd
        self.backoff_s = backoff_s
        self.max_attempts = max_attempts
        self.worker_args = list(worker_args or [])
        self.python = python
        self.stores = {t: HttpCheckpointStore(base_url, t, tok, timeout_s=timeout_s)
                       for t, tok in self.tokens.items()}
        self.running: dict[tuple[str, str], Resume] = {}
        self.attempts: dict[tuple[str, str], int] = {}
        self.not_before: dict[tuple[str, str], float] = {}
        # Runs the store answered migration_required -> the schema version refused.
        self.awaiting_migration: dict[tuple[str, str], int | None] = {}

    # --- one pass -------------------------------------------------------------------------

    def tick(self) -> list[str]:
        """Reap ended workers (logging each), then start a worker for every
        ``retry_approved`` run that has none and is not backing off (a run awaiting a
        migration: unless it is listed at another schema version now). Returns the log
        lines written in this pass."""
        lines = self.reap()
        now = time.monotonic()
        for tenant, store in self.stores.items():
            try:
                runs = list(store.list_runs(recovery_state="retry_approved"))
            except CheckpointError as exc:
                lines.append(self._log(f"tenant={tenant} list failed: {exc}"))
                continue
            for run in runs:
                key = (tenant, str(run.get("run_id")))
                if key in self.running:
                    continue
                if (key in self.awaiting_migration
                        and self.awaiting_migration[key] != run.get("schema_version")):
                    del self.awaiting_migration[key]  # migrated: go now
                    self.not_before.pop(key, None)
                if self.not_before.get(key, 0) > now:
                    continue
                if self.attempts.get(key, 0) >= self.max_attempts:
                    continue
                self.attempts[key] = self.attempts.get(key, 0) + 1
                self.running[key] = Resume(tenant, key[1],
                                           self._start(tenant, key[1], run.get("kind")),
                                           schema_version=run.get("schema_version"))
        return lines

    def _start(self, tenant: str, run_id: str, kind: str | None = None) -> subprocess.Popen:
        module = RESUMER_OF_KIND.get(kind or "", WORKER)
        argv = [self.python, "-m", module, "--resume",
                "--base-url", self.base_url, "--tenant", tenant, "--run-id", run_id,
                "--payments-url", self.payments_url, *self.worker_args]
        env = dict(os.environ, RECOVERY_TOKEN=self.tokens[tenant])
        env.pop("RECOVERY_TOKENS", None)  # a worker needs only its own tenant's token
        return subprocess.Popen(argv, env=env, cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def reap(self) -> list[str]:
        """Collect workers that ended; one log line each."""
        lines = []
        for key, resume in list(self.running.items()):
            if resume.proc.poll() is None:
                continue
            out, err = resume.proc.communicate()
            del self.running[key]
            result = _last_json(out)
            done = resume.proc.returncode == 0
            if done:
                self.attempts.pop(key, None)
                self.not_before.pop(key, None)
                self.awaiting_migration.pop(key, None)
            else:
                self.not_before[key] = time.monotonic() + self.backoff_s
            if not done and result.get("reason") == "migration_required":
                # A person's step, not a failure: no attempt spent, never given up on.
                # Its migration is seen on the next pass (another schema version); the
                # check in case the server's kinds changed comes rarely, since each try
                # reads the run's payload, an audited read (a newcomer found the
                # stranded run's trail growing every 30 s while it waited).
                self.attempts[key] = max(0, self.attempts.get(key, 1) - 1)
                self.awaiting_migration[key] = resume.schema_version
                self.not_before[key] = time.monotonic() + max(self.backoff_s,
                                                              MIGRATION_RECHECK_S)
            lines.append(self._log(self._describe(resume, result, err)))
        return lines

    def _describe(self, resume: Resume, result: dict, stderr: str) -> str:
        code = resume.proc.returncode
        outcome = result.get("outcome") or ("killed" if code and code < 0 else "error")
        parts = [f"tenant={resume.tenant}", f"run={resume.run_id}", f"exit={code}",
                 f"outcome={outcome}"]
        if result.get("action"):
            parts.append(f"decision={result['action']}/{result.get('reason', '')}")
        if result.get("revision") is not None:
            parts.append(f"revision={result['revision']}")
        if code != 0:
            tries = self.attempts.get((resume.tenant, resume.run_id), 0)
            last = (stderr.strip().splitlines() or [""])[-1]
            why = result.get("hint") or result.get("error") or last
            parts.append(f"why={why!r}")
            if result.get("reason") == "migration_required":
                parts.append("waiting=migration")  # tried again once migrated
            else:
                parts.append(f"attempt={tries}/{self.max_attempts}")
        parts.append(f"seconds={time.monotonic() - resume.started:.1f}")
        return " ".join(parts)

    def _log(self, text: str) -> str:
        line = f"{datetime.now(UTC).isoformat(timespec='seconds')} {text}"
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        return line

    # --- the loop -----------------------------------------------------------------------

    def serve(self, interval_s: float = 3, should_stop: Callable[[], bool] = lambda: False):
        """``tick`` every ``interval_s`` seconds until ``should_stop()``, reaping ended
        workers in between (so each is logged as it ends); then ``stop``."""
        try:
            while not should_stop():
                self.tick()
                deadline = time.monotonic() + interval_s
                while time.monotonic() < deadline and not should_stop():
                    time.sleep(0.1)
                    self.reap()
        finally:
            self.stop()

    def stop(self, grace_s: float = 5) -> None:
        """Let running workers finish for ``grace_s`` seconds, then terminate the rest."""
        deadline = time.monotonic() + grace_s
        while self.running and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        for resume in self.running.values():
            resume.proc.terminate()
        for resume in self.running.values():
            try:
                resume.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                resume.proc.kill()
        self.reap()


def _last_json(stdout: str) -> dict:
    for line in reversed((stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="resume runs whose retry was approved (demo)")
    p.add_argument("--base-url", required=True)
    p.add_argument("--payments-url", default="http://127.0.0.1:8765")
    p.add_argument("--log", default="var/demo-supervisor.log")
    p.add_argument("--interval", type=float, default=3, help="seconds between passes")
    p.add_argument("--backoff", type=float, default=30,
                   help="seconds before a run whose resume failed is tried again")
    p.add_argument("--attempts", type=int, default=3, help="tries per run")
    p.add_argument("--ttl", type=int, default=5, help="the workers' lease ttl in seconds")
    args = p.parse_args(argv)
    tokens = parse_tokens(os.environ.get("RECOVERY_TOKENS", ""))
    if not tokens:
        p.error("$RECOVERY_TOKENS (tenant=token,...) is required")
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    supervisor = Supervisor(base_url=args.base_url, payments_url=args.payments_url,
                            tokens=tokens, log_path=args.log, backoff_s=args.backoff,
                            max_attempts=args.attempts, worker_args=["--ttl", str(args.ttl)])
    supervisor.serve(args.interval, should_stop=lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
