"""scripts/function_lengths.py, the 80-line rule lint.sh applies to csrc/, finds what it should."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("function_lengths", REPO / "scripts" / "function_lengths.py")
assert _spec is not None and _spec.loader is not None
function_lengths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(function_lengths)


def _function(name: str, body_lines: int) -> str:
    body = "".join(f'  x += {i}; // a "}}" in a comment, {{\n' for i in range(body_lines))
    return f"int {name}(int x) {{\n{body}  return x;\n}}\n"


@pytest.mark.inprocess
def test_a_function_over_the_limit_is_found_and_one_at_it_is_not(tmp_path: Path) -> None:
    src = tmp_path / "a.cpp"
    # 1 line for the signature, 1 for the return and 1 for the brace: 78 + 3 = 81 lines.
    src.write_text(
        "namespace ringpg {\nnamespace {\n"
        + _function("atLimit", 77)
        + "} // namespace\n"
        + "struct S {\n  int member() {\n    return 1;\n  }\n};\n"
        + _function("overLimit", 78)
        + "} // namespace ringpg\n"
    )
    found = {(sig.split("(")[0], length) for _, length, sig in function_lengths.functions(src)}
    assert found == {("int atLimit", 80), ("int member", 3), ("int overLimit", 81)}
    long = function_lengths.too_long([str(src)])
    assert len(long) == 1 and "overLimit" in long[0] and "81 lines" in long[0]


@pytest.mark.inprocess
def test_the_exempt_functions_are_still_where_the_rule_names_them() -> None:
    # An exemption that no longer matches would exempt nothing and hide a rename.
    for path, start in function_lengths.EXEMPT:
        sigs = [sig for _, _, sig in function_lengths.functions(REPO / path)]
        assert any(sig.startswith(start) for sig in sigs), (path, start, sigs[:20])
