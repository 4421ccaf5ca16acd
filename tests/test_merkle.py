"""checkpoints.merkle against the RFC 6962 reference vectors (the certificate-transparency
test data: transparency-dev/merkle testonly) and property tests: every proof generated
verifies, and a changed one does not (issue 22, item 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoints import merkle

LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243",
                                     "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]
ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")]


def h(*hexes: str) -> list[bytes]:
    return [bytes.fromhex(x) for x in hexes]


INCLUSION = [  # (index, size, path)
    (0, 1, []),
    (0, 2, h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7")),
    (1, 2, h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d")),
    (2, 3, h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")),
    (1, 5, h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
    (0, 8, h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (5, 8, h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
]
CONSISTENCY = [  # (old, new, proof)
    (1, 1, []),
    (1, 8, h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (6, 8, h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
    (2, 5, h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
]


def perfect_over(hashes: list[bytes]):
    """A ``perfect`` callback folding the leaf hashes themselves (what a store without
    stored nodes would do); counts its calls."""
    def perfect(level: int, index: int) -> bytes:
        start = index << level
        assert start + (1 << level) <= len(hashes), "asked for a subtree past the tree"
        return merkle.root_of(hashes[start:start + (1 << level)])
    return perfect


def test_the_empty_tree_and_every_prefix_of_the_reference_tree_have_the_reference_root():
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    assert merkle.EMPTY_ROOT.hex().startswith("e3b0c442")
    for size, root in enumerate(ROOTS):
        assert merkle.root_of(hashes[:size]) == root, size
        assert merkle.frontier_root(merkle.frontier_of(size, perfect_over(hashes))) == root


@pytest.mark.parametrize("index, size, path", INCLUSION)
def test_inclusion_proofs_are_the_reference_ones_and_verify(index, size, path):
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    assert merkle.inclusion_proof(index, size, perfect_over(hashes[:size])) == path
    assert merkle.verify_inclusion(index, size, hashes[index], path, ROOTS[size])
    assert not merkle.verify_inclusion(index, size, hashes[index], path, ROOTS[size - 1])


@pytest.mark.parametrize("old, new, proof", CONSISTENCY)
def test_consistency_proofs_are_the_reference_ones_and_verify(old, new, proof):
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    assert merkle.consistency_proof(old, new, perfect_over(hashes[:new])) == proof
    assert merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], proof)
    if proof:
        assert not merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], proof[:-1])
        assert not merkle.verify_consistency(old, new, ROOTS[new], ROOTS[old], proof)


def test_append_lists_the_perfect_subtrees_it_completes():
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    frontier, done = [], []
    for i, leaf in enumerate(hashes):
        frontier, completed = merkle.append(frontier, i, leaf)
        done.extend(completed)
    assert [(lvl, idx) for lvl, idx, _ in done] == [(1, 0), (1, 1), (2, 0), (1, 2), (1, 3),
                                                    (2, 1), (3, 0)]
    assert done[-1][2] == ROOTS[8]
    assert done[0][2].hex() == "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"
    with pytest.raises(ValueError, match="frontier"):
        merkle.append(frontier, 7, hashes[0])


def flip(proof: list[bytes], i: int) -> list[bytes]:
    changed = list(proof)
    changed[i] = bytes([changed[i][0] ^ 1]) + changed[i][1:]
    return changed


sizes = st.integers(min_value=1, max_value=300)


@settings(max_examples=150, deadline=None)
@given(size=sizes, data=st.data())
def test_every_inclusion_proof_verifies_and_a_tampered_one_does_not(size, data):
    hashes = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(size)]
    root = merkle.root_of(hashes)
    index = data.draw(st.integers(0, size - 1))
    path = merkle.inclusion_proof(index, size, perfect_over(hashes))
    assert merkle.verify_inclusion(index, size, hashes[index], path, root)
    other = merkle.leaf_hash(b"forged")
    assert not merkle.verify_inclusion(index, size, other, path, root)
    if path:
        assert not merkle.verify_inclusion(index, size, hashes[index],
                                           flip(path, data.draw(st.integers(0, len(path) - 1))),
                                           root)
        assert not merkle.verify_inclusion(index, size, hashes[index], path[:-1], root)
    if size > 1:  # the same path does not prove the leaf at another index
        moved = (index + data.draw(st.integers(1, size - 1))) % size
        assert not merkle.verify_inclusion(moved, size, hashes[index], path, root) \
            or hashes[moved] == hashes[index]


@settings(max_examples=150, deadline=None)
@given(new=sizes, data=st.data())
def test_every_consistency_proof_verifies_and_a_tampered_one_does_not(new, data):
    hashes = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(new)]
    old = data.draw(st.integers(1, new))
    old_root, new_root = merkle.root_of(hashes[:old]), merkle.root_of(hashes)
    proof = merkle.consistency_proof(old, new, perfect_over(hashes))
    assert merkle.verify_consistency(old, new, old_root, new_root, proof)
    if proof:
        i = data.draw(st.integers(0, len(proof) - 1))
        assert not merkle.verify_consistency(old, new, old_root, new_root, flip(proof, i))
    rewritten = merkle.root_of([merkle.leaf_hash(b"x"), *hashes[1:old]])
    assert not merkle.verify_consistency(old, new, rewritten, new_root, proof)
    if old < new:  # a later tree whose old leaves were changed is not consistent
        forked = merkle.root_of([*hashes[:old], merkle.leaf_hash(b"y"), *hashes[old + 1:]])
        assert not merkle.verify_consistency(old, new, old_root, forked, proof)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 600))
def test_the_frontier_after_appends_is_the_one_read_from_subtrees(size):
    hashes = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(size)]
    frontier = []
    for i, leaf in enumerate(hashes):
        frontier, _ = merkle.append(frontier, i, leaf)
    assert frontier == merkle.frontier_of(size, perfect_over(hashes))
    assert merkle.frontier_root(frontier) == merkle.root_of(hashes)


def test_verify_head_says_what_is_wrong_with_a_bad_file_instead_of_a_traceback(tmp_path, capsys):
    """A newcomer's finding: a missing file or a line that is not a head ended in a
    traceback. Now each says what it is, and the exit code says the file did not hold."""
    from checkpoints.merkle import _main

    assert _main(["verify-head", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n[1]\n{"tree_size": "3", "origin": 5}\n\n')
    assert _main(["verify-head", str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "line 1: not a JSON object as export_audit_head writes"
    assert out[1] == "line 2: not a JSON object as export_audit_head writes"
    assert out[2].startswith("line 3: 5 size 3: ")


def test_verify_head_is_as_strict_as_the_service_and_names_the_signed_origin(tmp_path, capsys):
    """The second attack: a duplicated key, an unknown field or a root in upper case
    passed verify-head while verify_audit_chain --against refused them, and the unsigned
    "tenant" was printed as the head's owner."""
    from checkpoints.merkle import _main

    lines = ['{"tenant": "a", "tenant": "b"}', '{"extra": 1, "tree_size": 1}',
             '{"tree_size": 1, "root_hash": "' + "A" * 64 + '"}']
    heads = tmp_path / "heads.jsonl"
    heads.write_text("\n".join(lines) + "\n")
    assert _main(["verify-head", str(heads)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "line 1: not a JSON object as export_audit_head writes"
    assert out[1].endswith("unknown field 'extra'")
    assert out[2].endswith("root_hash: must be 64 lower-case hex digits")


def test_verify_head_has_help_and_says_how_to_call_it(capsys):
    """A newcomer's finding: ``verify-head --help`` tried to open a file named --help
    (exit 2). Now it prints the command's help (exit 0); a call without a command or
    with an unknown one prints the usage (exit 2)."""
    from checkpoints.merkle import _main

    assert _main(["verify-head", "--help"]) == 0
    out = capsys.readouterr().out
    assert "HEAD.jsonl" in out and "export_audit_head" in out
    assert _main([]) == 2
    assert "usage: python -m checkpoints.merkle" in capsys.readouterr().err
    assert _main(["verify", "heads.jsonl"]) == 2
    assert "invalid choice" in capsys.readouterr().err
