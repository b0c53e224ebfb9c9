"""The C++ error messages are built from strings only (csrc/validation.h): on the GPU machine's
torch build an integer streamed into a TORCH_CHECK message (c10::str's ostream) crashes the
process instead of raising, which no CPU-flavor test can see (it happened once, in
_gate_up_dgrad's shape check). This scans every TORCH_CHECK of csrc/ for message arguments that
read a tensor's sizes, dimension count or element count without std::to_string / shape_string."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# an argument that produces a number from a tensor's metadata
NUMERIC = re.compile(r"\.(size|dim|numel|stride|storage_offset|element_size)\s*\(")
# an argument that is a call of a free function (std::to_string, shape_string, a helper that
# returns the device as a string): its result is what goes into the message
CALL = re.compile(r"^[A-Za-z_][\w:]*\s*\(")


def _streams_a_number(arg: str) -> bool:
    return bool(NUMERIC.search(arg)) and not CALL.match(arg)


def _checks(text: str):
    """(line, [message arguments]) of every TORCH_CHECK(...) call in ``text``."""
    for m in re.finditer(r"\bTORCH_CHECK\s*\(", text):
        depth, i, args, start = 1, m.end(), [], m.end()
        in_str = False
        while i < len(text) and depth:
            c = text[i]
            if in_str:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    args.append(text[start:i])
            elif c == "," and depth == 1:
                args.append(text[start:i])
                start = i + 1
            i += 1
        yield text.count("\n", 0, m.start()) + 1, [a.strip() for a in args[1:]]


def test_the_scanner_finds_a_streamed_size():
    src = 'TORCH_CHECK(a.size(0) == 2, "x", op, ": got ", a.size(0), "!", std::to_string(b.dim()));'
    (line, args), = list(_checks(src))
    assert [a for a in args if _streams_a_number(a)] == ["a.size(0)"]
    (_, args), = list(_checks('TORCH_CHECK(ok, "n = ", 2 * w.size(0), f(x.dim()));'))
    assert [a for a in args if _streams_a_number(a)] == ["2 * w.size(0)"]


def test_no_message_streams_a_tensor_size():
    bad = []
    for path in sorted((REPO / "csrc").rglob("*.cpp")) + sorted((REPO / "csrc").rglob("*.h")):
        for line, args in _checks(path.read_text()):
            for a in args:
                if _streams_a_number(a):
                    bad.append(f"{path.relative_to(REPO)}:{line}: {a}")
    assert not bad, "\n".join(bad)
