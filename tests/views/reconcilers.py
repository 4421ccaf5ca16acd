"""A reconciler the dashboard tests script (configured by dotted path, as an operator
would with ``set_reconciler``): ``Scripted.answers`` are given in order, the last one
repeats."""

from __future__ import annotations

from checkpoints.reconcile import Answer, EffectRef


class Scripted:
    name = "scripted"
    answers: list[Answer] = []
    asked: list[str] = []

    def __init__(self, url: str = "", timeout_s: float = 5.0):
        pass

    def lookup(self, effect: EffectRef) -> Answer:
        Scripted.asked.append(effect.operation_key)
        if len(Scripted.answers) > 1:
            return Scripted.answers.pop(0)
        return Scripted.answers[0]
