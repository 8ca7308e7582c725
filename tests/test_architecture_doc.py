"""docs/ARCHITECTURE.md's package table against the code and the import-linter contracts in
``pyproject.toml``: every package and top-level module of the project has a row; every row
has a contract forbidding exactly what the row does not allow (so an allowed import missing
from either side, or a stale one, fails here); every "never imports" is a contract. That the
code keeps the contracts is `tests/test_layers.py`'s (lint-imports)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
TOP_PACKAGES = ("service", "app", "worker")
CONTRACT_SUFFIX = " imports only what docs/ARCHITECTURE.md allows"


@dataclass(frozen=True)
class Row:
    units: tuple[str, ...]  # dotted module names
    may_import: frozenset[str]
    never: frozenset[str]  # dotted first-party names, or external packages


def code_units() -> set[str]:
    """mebp_core's packages and top-level modules, and the three service packages."""
    core = REPO / "mebp_core"
    units = {f"mebp_core.{path.name}" for path in core.iterdir()
             if (path / "__init__.py").is_file()}
    units |= {f"mebp_core.{path.stem}" for path in core.glob("*.py") if path.stem != "__init__"}
    return units | set(TOP_PACKAGES)


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _dotted(name: str) -> str:
    """A table name: a path (``mebp_core/store/``, ``mebp_core/cli.py``), a top package, or
    a short mebp_core name (``errors``)."""
    name = name.strip("/").removesuffix(".py").replace("/", ".")
    return name if name.split(".")[0] in (*TOP_PACKAGES, "mebp_core") else f"mebp_core.{name}"


def doc_rows() -> list[Row]:
    section = DOC.read_text().split("## Packages and their rules", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        units = tuple(_dotted(name) for name in _names(cells[0]))
        rows.append(Row(units, frozenset(_dotted(n) for n in _names(cells[2])),
                        frozenset(_dotted(n) if _is_ours(n) else n for n in _names(cells[3]))))
    return rows


def _is_ours(name: str) -> bool:
    """A name of this project's, not a library's (``torch``, ``fastapi``)."""
    return _dotted(name) in code_units() | {"mebp_core"}


def expected_forbidden(row: Row, units: set[str]) -> list[str]:
    allowed = set()
    for name in row.may_import:
        allowed |= {u for u in units if u.startswith("mebp_core.")} if name == "mebp_core" \
            else {name}
    return sorted(units - allowed - set(row.units))


def contracts() -> list[dict]:
    with open(REPO / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["tool"]["importlinter"]["contracts"]


def test_every_package_and_module_has_a_row():
    documented = [unit for row in doc_rows() for unit in row.units]
    assert len(documented) == len(set(documented)), "a package has two rows"
    missing, stale = code_units() - set(documented), set(documented) - code_units()
    assert not missing, f"docs/ARCHITECTURE.md's table has no row for {sorted(missing)}"
    assert not stale, f"docs/ARCHITECTURE.md's table names what is gone: {sorted(stale)}"


def test_every_row_is_a_contract_forbidding_what_it_does_not_allow():
    units = code_units()
    by_source = {tuple(contract["source_modules"]): contract for contract in contracts()
                 if contract["name"].endswith(CONTRACT_SUFFIX)}
    for row in doc_rows():
        unknown = row.may_import - units - {"mebp_core"}
        assert not unknown, f"{row.units}: may import what does not exist: {sorted(unknown)}"
        contract = by_source.pop(row.units, None)
        assert contract is not None, f"pyproject.toml has no contract for {row.units}"
        assert contract["type"] == "forbidden" and contract["allow_indirect_imports"]
        want, have = expected_forbidden(row, units), sorted(contract["forbidden_modules"])
        assert have == want, (f"{row.units}: the table allows {sorted(set(have) - set(want))} "
                              f"that its contract forbids, and the contract allows "
                              f"{sorted(set(want) - set(have))} that the table does not")
    assert not by_source, f"contracts for rows the table does not have: {list(by_source)}"


def test_every_never_is_a_contract_even_indirectly():
    rules = contracts()
    for row in doc_rows():
        for unit in row.units:
            for name in row.never:
                assert any(_forbids(rule, unit, name) for rule in rules), \
                    f"no contract keeps {unit} from importing {name}"


def _forbids(rule: dict, unit: str, name: str) -> bool:
    if rule["name"].endswith(CONTRACT_SUFFIX):
        return False  # those allow indirect imports
    if rule["type"] == "independence":
        return {unit, name} <= set(rule["modules"])
    return rule["type"] == "forbidden" and unit in rule["source_modules"] and \
        name in rule["forbidden_modules"]
