"""Plan and run the demo's worker processes (stdlib only; ``manage.py demo`` drives it).

``plan(n, seed)`` decides, reproducibly for a seed, what each of about ``n`` worker
processes does: finish normally, SIGKILL itself at a random write-ahead boundary, or race
a partner on one checkpoint. ``plan_langgraph(n, seed)`` adds ``n`` runs of the LangGraph
refund example (``examples/langgraph_refund``): some finish, some SIGKILL themselves
inside the payment tool. ``run_units`` starts them as real processes (at most
``parallel`` at a time) and collects what each one printed and how it ended. Nothing is
simulated: a "crashed" run is one whose worker process really died, a "conflicted" run
one whose worker really lost a compare-and-swap.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from .worker import BOUNDARIES

WORKER = "checkpoints.demo.worker"
# The label of the unit that leaves an acme.order v1 run behind (``plan``): written as the
# code before v2 did, its worker killed after its in-flight checkpoint; ``manage.py demo``
# gets its retry approved, and serves with acme.order offline, so it waits for a migration.
STRANDED = "stranded v1"
LANGGRAPH_EXAMPLE = "examples.langgraph_refund.run"
# ``describe``'s name for the example's ``--crash-in-tool`` (after the provider's commit,
# before the effect is confirmed: the worker's ``after_call``, inside a LangGraph tool).
IN_TOOL = "in_tool"


@dataclass
class Unit:
    """One scheduling unit: an optional set-up command run first, then ``commands`` started
    together (a race pair), each an argv list for ``python -m <module>`` (the demo worker,
    or the LangGraph example's ``run``)."""

    tenant: str
    shape: str
    label: str
    commands: list[list[str]]
    setup: list[str] | None = None
    results: list[dict] = field(default_factory=list)
    module: str = WORKER


def plan(n: int, seed: int, tenants: tuple[str, ...] = ("acme", "globex")) -> list[Unit]:
    """About ``n`` worker processes: 1/9 of them in race pairs, 40% of the rest killed at
    a random boundary, the others finishing; 60% orders, 40% agent turns; 1 in 5 on the
    second tenant. Same ``seed``, same plan.

    Orders are written in ``acme.order`` v2 (the worker's default). Whatever the seed,
    the first tenant always gets one order killed at each boundary, one agent killed after
    its CRM call, and one order in v1 killed after its in-flight checkpoint (``STRANDED``:
    written as the code before v2 did), so the README's walk-through is always there.
    """
    rng = random.Random(seed)
    units: list[Unit] = []
    pairs = max(1, n // 9)
    singles = max(0, n - 2 * pairs)
    guaranteed = ([("order", b) for b in BOUNDARIES] + [("agent", "after_call")]
                  + [("order", STRANDED)])
    for i in range(singles + pairs):
        tenant = tenants[1] if len(tenants) > 1 and rng.random() < 0.2 else tenants[0]
        shape = "order" if rng.random() < 0.6 else "agent"
        if i < len(guaranteed) and i < singles:
            tenant, shape = tenants[0], guaranteed[i][0]
        base = ["--tenant", tenant, "--shape", shape, "--run-id", str(uuid.uuid4()),
                "--checkpoint-id", str(uuid.uuid4()), "--order-id", f"A-{1001 + i}",
                "--amount-cents", str(rng.choice([1299, 2599, 4999, 8900, 15000]))]
        if i >= singles:
            # Created by the workers themselves (the barrier); removed by the caller.
            race_dir = os.path.join(tempfile.gettempdir(), f"recovery-race-{uuid.uuid4().hex}")
            race = [*base, "--race-dir", race_dir, "--race-parties", "2"]
            units.append(Unit(tenant, shape, "race", [race, race], setup=[*base, "--create-only"]))
        elif i < len(guaranteed) and guaranteed[i][1] == STRANDED:
            units.append(Unit(tenant, shape, STRANDED, [[*base, "--schema-version", "1",
                                                          "--die-at", "after_intent"]]))
        elif i < len(guaranteed):
            boundary = guaranteed[i][1]
            units.append(Unit(tenant, shape, f"die {boundary}", [[*base, "--die-at", boundary]]))
        elif rng.random() < 0.4:
            boundary = rng.choice(BOUNDARIES)
            units.append(Unit(tenant, shape, f"die {boundary}", [[*base, "--die-at", boundary]]))
        else:
            units.append(Unit(tenant, shape, "finish", [base]))
    rng.shuffle(units)
    return units


def plan_langgraph(n: int, seed: int, tenants: tuple[str, ...] = ("acme", "globex"),
                   first_order: int = 2001) -> list[Unit]:
    """``n`` runs of the LangGraph refund example, each on its own thread
    (``refund-LG-<k>``, order ``LG-<k>`` from ``first_order``): a third of them (at least
    two, when ``n`` allows) SIGKILLed inside the payment tool on the first tenant, so the
    inbox always holds crashed LangGraph runs; the rest finish, 1 in 5 on the second
    tenant. Same ``seed``, same plan."""
    rng = random.Random(seed)
    killed = min(n, max(2, n // 3))
    units: list[Unit] = []
    for i in range(n):
        order = f"LG-{first_order + i}"
        crash = i < killed
        tenant = (tenants[1] if not crash and len(tenants) > 1 and rng.random() < 0.2
                  else tenants[0])
        args = ["--tenant", tenant, "--thread-id", f"refund-{order}", "--order-id", order,
                "--amount-cents", str(rng.choice([1299, 2599, 4999, 8900, 15000]))]
        if crash:
            args.append("--crash-in-tool")
        units.append(Unit(tenant, "langgraph", f"die {IN_TOOL}" if crash else "finish",
                          [args], module=LANGGRAPH_EXAMPLE))
    rng.shuffle(units)
    return units


def _argv(common: list[str], args: list[str], module: str = WORKER) -> list[str]:
    return [sys.executable, "-m", module, *common, *args]


def run_units(units: list[Unit], *, base_url: str, payments_url: str, tokens: dict[str, str],
              ttl_s: int = 5, parallel: int = 6, cwd: str | None = None,
              on_result=None) -> Counter:
    """Run every unit's processes, at most ``parallel`` at a time (a race pair starts
    together). ``tokens`` maps tenant slug -> writer token (passed in ``$RECOVERY_TOKEN``,
    never on the command line). Returns a tally of outcomes (``completed``, ``lost_race``,
    ``killed after_call``, ...). ``on_result(unit, result)`` is called as each ends."""
    common = ["--base-url", base_url, "--payments-url", payments_url, "--ttl", str(ttl_s)]
    pending = list(units)
    running: list[tuple[Unit, subprocess.Popen, list[str]]] = []
    tally: Counter = Counter()

    def env_for(tenant: str) -> dict:
        return dict(os.environ, RECOVERY_TOKEN=tokens[tenant])

    while pending or running:
        while pending and len(running) + len(pending[0].commands) <= parallel:
            unit = pending.pop(0)
            if unit.setup:
                subprocess.run(_argv(common, unit.setup, unit.module),
                               env=env_for(unit.tenant), cwd=cwd, capture_output=True,
                               timeout=60, check=False)
            for args in unit.commands:
                proc = subprocess.Popen(_argv(common, args, unit.module),
                                        env=env_for(unit.tenant), cwd=cwd,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
                running.append((unit, proc, args))
        still = []
        for unit, proc, args in running:
            if proc.poll() is None:
                still.append((unit, proc, args))
                continue
            out, err = proc.communicate()
            result = describe(proc.returncode, out, err, args)
            unit.results.append(result)
            tally[result["outcome"]] += 1
            if on_result:
                on_result(unit, result)
        running = still
        time.sleep(0.02)
    return tally


def describe(returncode: int, stdout: str, stderr: str, args: list[str]) -> dict:
    """What one worker process did: its JSON line, or ``killed <boundary>`` if SIGKILLed."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("{")), "")
    try:
        result = json.loads(line) if line else {}
    except ValueError:
        result = {}
    if returncode == -signal.SIGKILL:
        boundary = (args[args.index("--die-at") + 1] if "--die-at" in args
                    else IN_TOOL if "--crash-in-tool" in args else "?")
        result.update(outcome=f"killed {boundary}")
    elif "outcome" not in result:  # nothing said, or only the "started" line
        result.update(outcome="error", error=stderr.strip()[-500:])
    result["returncode"] = returncode
    return result
