"""The vendored CONTRACT.md and the parser that the contract-driven tests read it with
(``tests/contract_tables.py``)."""

from __future__ import annotations

import pytest

from checkpoints import roles as code_roles
from checkpoints.models import EffectState
from tests import contract_tables as contract
from tests.contract_tables import NEW, ContractFormatError, parse_tables


def test_the_vendored_contract_is_the_shared_one_byte_for_byte():
    if not contract.SHARED_CONTRACT_PATH.exists():
        pytest.skip(f"{contract.SHARED_CONTRACT_PATH} is not here (a CI clone has only the "
                    f"repository): nothing to compare docs/CONTRACT.md with")
    assert contract.CONTRACT_PATH.read_bytes() == contract.SHARED_CONTRACT_PATH.read_bytes(), (
        "docs/CONTRACT.md differs from ../shared/CONTRACT.md: copy the shared one over it "
        "(cp ../shared/CONTRACT.md docs/CONTRACT.md) and run the contract-driven tests")


def test_the_effect_table_names_the_models_states():
    assert set(contract.effect_states()) == set(EffectState.values)


def test_the_effect_table_reads_as_the_contract_says():
    # Spot checks of the parser on rows with several states or actors in one cell.
    moves = contract.effect_transitions()
    assert moves[(NEW, "planned")] == {"runtime"}
    assert moves[("submitted", "confirmed")] == {"runtime", "reconciliation"}
    assert moves[("unresolved", "not_executed")] == {"reconciliation"}
    assert moves[("unresolved", "unknown")] == {"reviewer", "reconciliation"}
    assert moves[("submitted", "unresolved")] == {"runtime", "sweep"}
    assert moves[("unknown", "planned")] == {"retry"}
    assert len(moves) == 12


def test_the_roles_table_names_the_codes_roles():
    assert tuple(contract.roles()) == code_roles.ROLES
    roles = contract.roles()
    assert roles["viewer"].denied == {"payloads"}
    assert roles["reviewer"].rights > roles["viewer"].rights
    assert "grant roles in it" in roles["admin"].rights
    assert all(roles[r].rights <= roles["admin"].rights for r in roles)


def test_the_review_actions_table_names_who_may():
    who = {(r.method, r.path): r.extra["who"] for r in contract.review_actions()}
    assert who[("POST", "retry-requests/{}/reject")] == "approver"  # the ".../reject" row
    assert who[("GET", "audit-events")] == "viewer"


def test_it_refuses_a_table_it_cannot_read():
    with pytest.raises(ContractFormatError):
        parse_tables("| a | b |\n| --- | --- |\n| only one |\n")
    with pytest.raises(ContractFormatError):
        contract._actors("the operator, by hand")
    with pytest.raises(ContractFormatError):
        contract._states("`planned` or maybe something")


def test_it_reads_escaped_pipes_inside_a_cell():
    (t,) = parse_tables("## 3. X\n| request | answers |\n| --- | --- |\n"
                        "| `GET …/runs?s=a\\|b` | 200 |\n")
    assert t.rows == (("`GET …/runs?s=a|b`", "200"),)
    assert t.section == "3"
