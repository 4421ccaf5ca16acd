"""runifold in and out (issue 10, item 4): JSON Lines of runifold checkpoint envelopes
and effect records, in runifold's own shapes (RUNIFOLD.md 1-4), imported into one
tenant and exported back. The format, the mapping and the rules are written up in
``docs/runifold.md``; in short:

- **A line says what it is by its shape.** An object with ``kind`` and ``payload`` is a
  checkpoint envelope (``runifold.agent`` v1, ``runifold.workflow`` v3/v4, checked by
  ``parse_envelope`` and the kind registry like an API write, except that a payload the
  registry refuses is an error here instead of a ``schema_mismatch`` run: a file is
  checked before it lands, and its operator is there to read the answer). An object with
  ``request`` and ``status`` is an effect record (``EffectRecord``, RUNIFOLD.md 4), which
  may carry one extra top-level field, ``run_id``. Anything else is an error.
- **Effects.** runifold keeps no run id on an effect: a line without ``run_id`` takes the
  run of the checkpoint its agent idempotency key names
  (``{execution_id}:agent:...``, the execution id being a checkpoint id known in the
  tenant, earlier in the file or already stored), else it is an error naming ``run_id``.
  Statuses map prepared -> ``planned``, started -> ``unresolved`` (in doubt, see below),
  completed -> ``confirmed`` (receipt: the output), failed -> ``failed`` (receipt: the
  ``RunError``). ``service`` is ``<kind>:<capability_id>`` and ``operation_key`` the
  idempotency key (else the effect id), so (service, operation_key) is unique exactly
  where runifold's (capability_id, idempotency_key) is. The request itself, in
  canonical JSON, is kept encrypted in ``request_ciphertext``; ``request_fingerprint`` is
  its SHA-256. That is what export needs to write the record back.
- **Why started -> unresolved and not submitted.** ``submitted`` means "an owner sent it
  and may still be waiting for the answer"; nobody in this store ever will: the process
  that wrote the record wrote it to runifold's store, not here. runifold itself treats
  ``started`` as ambiguous on every load (reconcile first, RUNIFOLD.md 4), which is what
  ``unresolved`` means here (CONTRACT.md 3: "submitted -> unresolved: runtime on
  restart"; an import is such a restart). So the run is ``ambiguous`` at once and
  reconciliation may be asked for it, instead of looking healthy for the tenant's
  ambiguity threshold. ``submitted_at`` is the import's database time (the settle delay
  counts from the latest moment the call could have been sent).
- **Revisions.** A checkpoint or effect not in the store is created at the line's
  revision (``checkpoint.import``/``effect.import``, one audit event per line written).
  One that is advances only by the exact next revision. A line whose (id, revision) is
  stored with identical content is skipped and counted; different content is an error
  (a conflict, never overwritten); a revision further ahead is an error (a gap), and
  one older than the first stored revision too. Fencing holds: a run that has had an
  owner here (a lease, a fencing token) is not written by an import, which carries no
  token; nor is a run whose payloads retention or erasure deleted (the API's
  ``run_deleted`` rule, each of its lines an error).
- **Batches.** Lines are read one at a time and written ``batch_size`` at a time, each
  batch in one transaction: the rights check, the run locks (in id order), the writes,
  the subject index of the written payloads (as an API write's), the runs' recovery state (``runs.run_save_many``) and one audit event per written line
  (``audit.audit_record_many``). A bad line is reported and left out; the rest of its
  batch is written. If the database refuses a batch (another writer took an id or a key
  meanwhile), the batch is rolled back and written again one line per transaction, so
  the refusal lands on its own line. Memory holds one batch, never the file.
- **Export** writes the latest revision of every runifold checkpoint (or, with
  ``history``, every stored revision after the checkpoint's last unsupported one, oldest
  first: no gap, and the left-out revisions counted), then every effect that carries a
  runifold request, rendered back (``planned`` -> prepared at revision 0, started after
  it: runifold has no re-plan, see ``runifold_status``; ``submitted``, ``unresolved``,
  ``unknown``, ``not_executed`` -> started: still in doubt for runifold, which fails
  closed; ``confirmed`` -> completed; ``failed`` -> failed). An effect line
  gets ``run_id`` only when its key would not lead an import back to its run. Each page is
  read, decrypted and audited (``runifold.export``) in one transaction and written out
  after it commits. What export writes, import accepts; re-importing it into the same
  tenant skips every line.

A package by what each part does: ``lines`` (runifold's words, reading and checking one
line, no database), ``imports`` (``runifold_import``: deciding each line against the
store), ``writes`` (the writes of one checked batch) and ``exports``
(``runifold_export``). It sits above the services (``checkpoints.interop``,
docs/architecture.md): callers write ``from checkpoints.interop import runifold`` then
``runifold.runifold_import(...)``.
"""

# ruff: noqa: F401 - this module is the package's interface: it re-exports its operations.

from .exports import EXPORT_PAGE, EXPORT_PAGE_BYTES, ExportReport, runifold_export
from .imports import ImportReport, runifold_import
from .lines import (
    DEFAULT_BATCH,
    KINDS,
    CheckpointLine,
    EffectLine,
    LineError,
    RawLine,
    execution_id,
    jsonl_lines,
    parse_line,
    runifold_status,
    status_out,
)
