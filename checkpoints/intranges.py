"""The range of every integer the API and the imports take, written once (issue 17,
item 1; CONTRACT.md 2 and 6).

Each range is the one the parser checks (``check``, a 400 naming the field), the one the
OpenAPI schema documents (``schema``: ``min_value``/``max_value`` of a DRF field, or an
``OpenApiParameter``'s schema), and fits the column it is stored in: every value in range
is stored without ``integer out of range``. A range that does not come from a column is
the rule's own (a lease lasts at most a day). ``tests/api/test_integer_bounds.py`` (the
boundary table) sends every integer input of the schema the values where integers break
and holds each to its range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidPayload

_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,19})\Z")


@dataclass(frozen=True)
class IntRange:
    """``minimum..maximum``, both included."""

    minimum: int
    maximum: int

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is an ``int`` (not a ``bool``) in the range."""
        return type(value) is int and self.minimum <= value <= self.maximum

    def check(self, value: Any, field: str) -> int:
        """``value`` when ``contains`` it, else ``InvalidPayload`` (400)
        ``"<field>: must be an integer in <minimum>..<maximum>"``."""
        if not self.contains(value):
            raise InvalidPayload(f"{field}: must be an integer in {self.minimum}..{self.maximum}")
        return value

    def parse(self, text: Any, field: str) -> int:
        """``text`` (a URL segment, a command-line argument) read as an integer of this
        (non-negative) range: ASCII digits only, no sign, no leading zero but ``0``
        itself, no spaces or ``_`` (all of which Python's ``int()`` takes, as it takes
        other scripts' digits). The one reading of an integer given as text, so the API's
        URL and ``manage.py`` refuse the same texts; else ``check``'s ``InvalidPayload``."""
        if isinstance(text, str) and _DECIMAL.match(text):
            return self.check(int(text), field)
        return self.check(None, field)

    def field_kwargs(self) -> dict[str, int]:
        """``min_value``/``max_value`` for a DRF ``IntegerField`` (the schema's range)."""
        return {"min_value": self.minimum, "max_value": self.maximum}

    def schema(self) -> dict[str, Any]:
        """An OpenAPI schema object: an integer in the range."""
        return {"type": "integer", "format": "int64", "minimum": self.minimum,
                "maximum": self.maximum}


I63 = 2**63 - 1

#: A revision (CONTRACT.md 2: 0..2^63-1; ``BigIntegerField`` columns).
REVISION = IntRange(0, I63)
#: ``Fencing-Token`` (``Run.fencing_token``, a ``BigIntegerField``).
FENCING_TOKEN = IntRange(0, I63)
#: An envelope's ``schema_version`` (runifold-core's is a u32; ``Checkpoint`` and ``Run``
#: hold it in 64-bit columns).
SCHEMA_VERSION = IntRange(0, 2**32 - 1)
#: An envelope's ``updated_at_ms``, the writer's clock (a ``BigIntegerField``).
UPDATED_AT_MS = IntRange(0, I63)
#: A usage counter a runtime sends with ``POST …/resume`` (runifold's counters are
#: ``u64``, RUNIFOLD.md 2; compared, never stored).
USAGE_COUNTER = IntRange(0, 2**64 - 1)
#: A lease's ``ttl_s``: at most a day.
LEASE_TTL_S = IntRange(1, 86400)
#: A retry request's id in a URL (a ``BigAutoField``); outside it: 404, no such request.
ROW_ID = IntRange(1, I63)
#: ``payloads_rotate_keys``' rows per transaction (``manage.py rotate_payload_keys
#: --batch-size``): the query's ``LIMIT``, bounded like the other commands' batches (a
#: 2^70 reached PostgreSQL as ``bigint out of range``: the attack's finding, stop 33).
ROTATE_BATCH = IntRange(1, 10_000)
