"""RFC 6962 / RFC 9162 Merkle trees, as pure functions (no Django): the audit trail's
tree (issue 22, item 1; docs/security/audit.md), usable by an outsider with the standard
library alone.

- ``leaf_hash(data)`` = SHA-256(0x00 || data); ``node_hash(l, r)`` = SHA-256(0x01 || l || r);
  the empty tree's root is SHA-256("") (``EMPTY_ROOT``).
- A **frontier** (a compact range from 0) is the list of the roots of the perfect
  subtrees a tree of ``size`` leaves splits into, left to right, largest first (one per
  bit set in ``size``): ``append`` adds a leaf to it, ``frontier_root`` folds it into
  the tree's root. The sequencer keeps one per signed head.
- Proofs (``inclusion_proof``, ``consistency_proof``) follow RFC 6962 section 2.1 (PATH,
  SUBPROOF); the subtrees they need come from a callback ``perfect(level, index)``: the
  root of the perfect subtree of ``2**level`` leaves starting at leaf ``index << level``
  (a stored node, or folded from leaves), so a store answers from what it keeps.
- Verification (``verify_inclusion``, ``verify_consistency``) is RFC 9162 sections
  2.1.3.2 and 2.1.4.2. Hashes are 32-byte ``bytes`` throughout.

Command line (an outsider's check of an exported head, with the public key only)::

    python -m checkpoints.merkle verify-head HEAD.json

reads one line written by ``manage.py export_audit_head`` and checks its Ed25519
signature over its checkpoint text (``cryptography``, already a dependency).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

EMPTY_ROOT = hashlib.sha256(b"").digest()

Perfect = Callable[[int, int], bytes]


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of a leaf whose input is ``data``."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): an inner node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2): RFC 6962's ``k``."""
    return 1 << ((n - 1).bit_length() - 1)


# --------------------------------------------------------------------------------------
# Frontier (compact range from 0)
# --------------------------------------------------------------------------------------

def frontier_levels(size: int) -> list[int]:
    """The levels of the perfect subtrees of a tree of ``size`` leaves, largest first."""
    return [lvl for lvl in range(size.bit_length() - 1, -1, -1) if size >> lvl & 1]


def append(frontier: list[bytes], size: int, leaf: bytes
           ) -> tuple[list[bytes], list[tuple[int, int, bytes]]]:
    """Add the leaf hash ``leaf`` to the frontier of a tree of ``size`` leaves. Returns
    ``(new frontier, completed)``: ``completed`` lists the perfect subtrees the leaf
    completed, ``(level, index, root)`` from level 1 up (level 0, the leaf itself, is
    not listed), for a store that keeps some levels. Raises ``ValueError`` when the
    frontier does not fit ``size``."""
    if len(frontier) != bin(size).count("1"):
        raise ValueError(f"frontier: {len(frontier)} hash(es) for a tree of {size} leaves")
    frontier = list(frontier)
    completed: list[tuple[int, int, bytes]] = []
    h, level, n = leaf, 0, size
    while n & 1:  # merge with the perfect subtree of the same level to the left
        h = node_hash(frontier.pop(), h)
        level += 1
        n >>= 1
        completed.append((level, (size + 1 >> level) - 1, h))
    frontier.append(h)
    return frontier, completed


def frontier_root(frontier: list[bytes]) -> bytes:
    """The root of the tree the frontier describes (``EMPTY_ROOT`` for none)."""
    if not frontier:
        return EMPTY_ROOT
    h = frontier[-1]
    for left in reversed(frontier[:-1]):
        h = node_hash(left, h)
    return h


def frontier_of(size: int, perfect: Perfect) -> list[bytes]:
    """The frontier of the tree of ``size`` leaves, from ``perfect``."""
    out, start = [], 0
    for level in frontier_levels(size):
        out.append(perfect(level, start >> level))
        start += 1 << level
    return out


def root_of(leaves: list[bytes]) -> bytes:
    """The root of the tree with these leaf hashes (``EMPTY_ROOT`` for none)."""
    frontier: list[bytes] = []
    for i, leaf in enumerate(leaves):
        frontier, _ = append(frontier, i, leaf)
    return frontier_root(frontier)


# --------------------------------------------------------------------------------------
# Subtrees and proofs (RFC 6962 2.1)
# --------------------------------------------------------------------------------------

def subtree_root(start: int, end: int, perfect: Perfect) -> bytes:
    """MTH(D[start:end]) for ``start`` a multiple of the largest power of two not above
    ``end - start`` (every range the proofs ask for is), from ``perfect``."""
    n = end - start
    if n <= 0:
        raise ValueError(f"range: empty ({start}..{end})")
    if n & (n - 1) == 0:
        level = n.bit_length() - 1
        return perfect(level, start >> level)
    k = _split(n)
    return node_hash(subtree_root(start, start + k, perfect),
                     subtree_root(start + k, end, perfect))


def inclusion_proof(index: int, size: int, perfect: Perfect) -> list[bytes]:
    """PATH(index, D[size]): the audit path of leaf ``index`` in the tree of ``size``
    leaves, bottom up. Raises ``ValueError`` unless 0 <= index < size."""
    if not 0 <= index < size:
        raise ValueError(f"index: {index} is not below the tree size {size}")
    path: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index - start < k:
            path.append(subtree_root(start + k, end, perfect))
            end = start + k
        else:
            path.append(subtree_root(start, start + k, perfect))
            start += k
    path.reverse()
    return path


def consistency_proof(old: int, new: int, perfect: Perfect) -> list[bytes]:
    """PROOF(old, D[new]): the consistency proof from the tree of ``old`` leaves to the
    tree of ``new`` (empty when ``old`` is 0 or equals ``new``). Raises ``ValueError``
    unless 0 <= old <= new."""
    if not 0 <= old <= new:
        raise ValueError(f"sizes: {old} is not within 0..{new}")
    if old in (0, new):
        return []
    proof: list[bytes] = []
    start, end, whole = 0, new, True  # SUBPROOF(m, D[start:end], whole)
    m = old
    while m != end - start:
        k = _split(end - start)
        if m <= k:
            proof.append(subtree_root(start + k, end, perfect))
            end = start + k
        else:
            proof.append(subtree_root(start, start + k, perfect))
            m -= k
            start += k
            whole = False
    if not whole:
        proof.append(subtree_root(start, end, perfect))
    proof.reverse()
    return proof


# --------------------------------------------------------------------------------------
# Verification (RFC 9162 2.1.3.2 and 2.1.4.2)
# --------------------------------------------------------------------------------------

def root_from_inclusion(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes | None:
    """The root that ``path`` proves leaf hash ``leaf`` at ``index`` under, in a tree of
    ``size`` leaves, or None when the path cannot be one (wrong length, index out of
    range)."""
    if not 0 <= index < size:
        return None
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(index: int, size: int, leaf: bytes, path: list[bytes],
                     root: bytes) -> bool:
    """Whether ``path`` proves leaf hash ``leaf`` at ``index`` in the tree of ``size``
    leaves whose root is ``root``."""
    return root_from_inclusion(index, size, leaf, path) == root


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes,
                       proof: list[bytes]) -> bool:
    """Whether ``proof`` shows the tree of ``old`` leaves with root ``old_root`` is a
    prefix of the tree of ``new`` leaves with root ``new_root``."""
    if not 0 <= old <= new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if old == 0:
        return not proof
    if old & (old - 1) == 0:  # a power of two: the old root is the first node
        proof = [old_root, *proof]
    if not proof:
        return False
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


# --------------------------------------------------------------------------------------
# Checkpoints (C2SP tlog-checkpoint) and an outsider's check of an exported head
# --------------------------------------------------------------------------------------

def checkpoint_text(origin: str, size: int, root: bytes) -> str:
    """The C2SP tlog checkpoint body: origin line, tree size, base64 root, each ending
    in a newline. The tree head's Ed25519 signature is over these UTF-8 bytes."""
    return f"{origin}\n{size}\n{base64.b64encode(root).decode('ascii')}\n"


def verify_head_line(record: dict) -> str:
    """Check one exported head (a dict as ``export_audit_head`` prints it) with its
    public key alone: the checkpoint text names its tree size and root, and the Ed25519
    signature verifies over it with ``public_key`` (base64, 32 raw bytes), whose SHA-256
    starts with ``key_id``. Returns the problem, or "". It does
    not prove the key is the operator's: compare ``public_key`` with the one published."""
    try:
        raw = base64.b64decode(record["public_key"], validate=True)
        key = Ed25519PublicKey.from_public_bytes(raw)
        signature = base64.b64decode(record["signature"], validate=True)
        root = bytes.fromhex(record["root_hash"])
        origin, size = record["origin"], record["tree_size"]
        if not isinstance(origin, str) or type(size) is not int or size < 0:
            raise ValueError("origin must be a string, tree_size an integer >= 0")
    except (KeyError, ValueError, TypeError) as exc:
        return f"malformed head ({exc})"
    if hashlib.sha256(raw).hexdigest()[:16] != record.get("key_id"):
        return "key_id is not the public key's"
    text = checkpoint_text(origin, size, root)
    if record.get("checkpoint") not in (None, text):
        return "the checkpoint text does not match the tree size and root"
    try:
        key.verify(signature, text.encode("utf-8"))
    except InvalidSignature:
        return "the signature does not verify"
    return ""


#: The fields of an exported head line (``audittree.head_json`` plus ``tenant``): the
#: same line ``audithead.audit_head_parse`` accepts, nothing else.
HEAD_FIELDS = {"tenant", "origin", "tree_size", "root_hash", "created_at", "key_id",
               "public_key", "signature", "checkpoint"}
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicated key")
    return dict(pairs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checkpoints.merkle",
        description="Check signed audit tree heads with their public keys alone (no "
                    "database, no secret): the outsider's check of issue 22.")
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser(
        "verify-head", help="verify each head of a file export_audit_head wrote",
        description="Verify each line of HEAD.jsonl (export_audit_head's output): its "
                    "Ed25519 signature over the C2SP checkpoint, with the public key the "
                    "line carries. Exit 0: every head verifies; 1: one does not; 2: the "
                    "file cannot be read.")
    verify.add_argument("file", metavar="HEAD.jsonl")
    return parser


def _shown(value) -> str:
    """A value of the file as printed: a printable string or an integer as it is, any
    other value as its ``repr`` (no control character of the file reaches the output)."""
    if (isinstance(value, str) and value.isprintable()) or type(value) is int:
        return str(value)
    return repr(value)


def _main(argv: list[str]) -> int:
    """``python -m checkpoints.merkle verify-head HEAD.jsonl``: prints one line per head;
    returns 0 when every head verifies, 1 when one does not, 2 for a usage error or a
    file that cannot be read (``--help``: 0)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    bad = 0
    try:
        with open(args.file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{args.file}: cannot read it ({exc})", file=sys.stderr)
        return 2
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_no_duplicates)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            bad += 1
            print(f"line {number}: not a JSON object as export_audit_head writes")
            continue
        if "tree_size" not in record:
            print(f"line {number}: an HMAC head (before the Merkle tree): needs the key")
            continue
        unknown = sorted(set(record) - HEAD_FIELDS)
        problem = (f"unknown field {unknown[0][:40]!r}" if unknown
                   else "root_hash: must be 64 lower-case hex digits"
                   if not _HEX64.fullmatch(str(record.get("root_hash", "")))
                   else verify_head_line(record))
        bad += bool(problem)
        # The origin is signed; the line's "tenant" is not, so it is not what is named.
        # The file is an outsider's: a carriage return or newline shown raw would
        # rewrite what the reader sees (``_shown``).
        print(f"line {number}: {_shown(record.get('origin'))} size "
              f"{_shown(record.get('tree_size'))}: " + (problem or "signature verifies"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
