"""The C++ error messages are built from strings only (csrc/validation.h): on the GPU machine's
torch build a number streamed into a TORCH_CHECK message (c10::str's ostream) crashes the process
instead of raising, which no CPU-flavor test can see (it happened once, in _gate_up_dgrad's shape
check). This scans every TORCH_CHECK of csrc/ and accepts only message arguments known to be
strings: literals, the string-making functions below, `.str()`, ternaries of those, and the
identifiers listed (each checked to be a `const char*` / `std::string` where it is declared). A
new kind of argument fails here until it is added, after checking that it is a string."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: functions whose result is a string (std::string or const char*)
STRING_FUNCTIONS = ("std::to_string", "std::string", "shape_string", "dtype_name", "describe",
                    "cudaGetErrorString", "first_tensor_device", "kernels::gemm_status_string")
#: identifiers that are strings where they are used in messages
STRING_NAMES = {"arg", "given", "kOp", "name", "op", "overload", "q_name", "ref_arg",
                "short_name", "want", "what", "written_arg", "detail", "kFields[f]", "plan.name"}


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


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


def _is_string(arg: str) -> bool:
    arg = arg.strip()
    if re.fullmatch(r'(?:"(?:[^"\\]|\\.)*"\s*)+', arg):  # literals, adjacent ones joined
        return True
    if arg in STRING_NAMES:
        return True
    m = re.fullmatch(r"([\w:]+)\s*\((.*)\)", arg, re.S)
    if m and m.group(1) in STRING_FUNCTIONS:
        return True
    if arg.endswith(".str()"):
        return True
    t = re.fullmatch(r"(.+?)\?(.+):(.+)", arg, re.S)  # cond ? a : b
    return bool(t) and _is_string(t.group(2)) and _is_string(t.group(3))


def test_the_scanner_tells_strings_from_numbers():
    src = ('TORCH_CHECK(a.size(0) == 2, "x", op, ": got ", a.size(0), "!", std::to_string(b.dim()),'
            ' n, flag ? "yes" : "no", t.device().str(), k ? n : "none", "a" "b");')
    (line, args), = list(_checks(src))
    assert [a for a in args if not _is_string(a)] == ["a.size(0)", "n", 'k ? n : "none"']


def test_every_message_argument_is_a_string():
    bad = []
    for path in sorted((REPO / "csrc").rglob("*.cpp")) + sorted((REPO / "csrc").rglob("*.h")):
        for line, args in _checks(_strip_comments(path.read_text())):
            bad += [f"{path.relative_to(REPO)}:{line}: {a}" for a in args if not _is_string(a)]
    assert not bad, "\n".join(bad)
