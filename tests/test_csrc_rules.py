"""scripts/csrc_rules.py, the house rules lint.sh applies to csrc/ (80 lines a function, no
figure in a comment), finds what it should and nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("csrc_rules", REPO / "scripts" / "csrc_rules.py")
assert _spec is not None and _spec.loader is not None
csrc_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(csrc_rules)


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
    found = {(sig.split("(")[0], length) for _, length, sig in csrc_rules.functions(src)}
    assert found == {("int atLimit", 80), ("int member", 3), ("int overLimit", 81)}
    long = csrc_rules.too_long([str(src)])
    assert len(long) == 1 and "overLimit" in long[0] and "81 lines" in long[0]


@pytest.mark.inprocess
def test_the_exempt_functions_are_still_where_the_rule_names_them() -> None:
    # An exemption that no longer matches would exempt nothing and hide a rename.
    for path, start in csrc_rules.EXEMPT:
        sigs = [sig for _, _, sig in csrc_rules.functions(REPO / path)]
        assert any(sig.startswith(start) for sig in sigs), (path, start, sigs[:20])


@pytest.mark.inprocess
def test_a_figure_in_a_comment_is_found_and_formulas_durations_and_code_are_not(tmp_path: Path) -> None:
    quoted = [
        "// reduce-scatter of 64 MiB on an H100 ran at 0.45x gloo's pinned path.",
        "  // ring beat 2-5x at 4 and 8 ranks, 4-64 KiB, on 16 cores.",
        "int x = 1; // slots 9–41% faster",
        "// took 1.0-1.2× its time",
        "// process_vm_readv 14 GB/s",
    ]
    clean = [
        "// N x 2 x this in /dev/shm; larger buffers move large messages in fewer rounds.",
        "// polls it for up to 1 ms, yielding between looks; 0.1 us is all a probe resolves",
        "constexpr uint32_t kMask = 0xFFFFu; // each share times 0xFFFF fills its 16 bits",
        'double ratio = 0.9 * x; const char* s = "2.5x";',
    ]
    src = tmp_path / "a.cpp"
    src.write_text("\n".join(quoted + clean) + "\n")
    found = csrc_rules.figures([str(src)])
    assert [int(f.split(":")[1]) for f in found] == list(range(1, len(quoted) + 1)), found
