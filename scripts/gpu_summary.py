"""Writes the Markdown summary of a GPU check run (called by scripts/gpu_check.sh).

Reads the pytest JUnit XML and the kernel self-test log and prints device, versions, date, the
command, build time and pass / fail / skip counts, so a committed summary says exactly what ran.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import torch
from prebuilt_extension import md5  # scripts/, this script's own folder


def junit_counts(path: str) -> dict[str, int]:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    return counts


def failed_names(path: str) -> list[str]:
    names = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            names.append(f"{case.get('classname')}::{case.get('name')}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--junit", required=True)
    parser.add_argument("--build-seconds", type=int, required=True)
    parser.add_argument("--build-rc", type=int, required=True)
    parser.add_argument("--selftests", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()

    print("# cutlass_nn GPU check\n")
    print(f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}")
    print(f"- command: `{args.command}`")
    knobs = [f"{k}={os.environ[k]}" for k in ("CUTLASS_NN_CUDA_ARCHS", "MAX_JOBS", "PYTEST_TARGETS", "SKIP_BUILD",
                                                "PREBUILT_SO")
             if os.environ.get(k)]
    if knobs:
        print(f"- environment: {', '.join(knobs)}")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(
            f"- device: {props.name} (compute capability {props.major}.{props.minor}, "
            f"{props.multi_processor_count} SMs), {torch.cuda.device_count()} GPU(s)"
        )
    else:
        print("- device: no CUDA device visible")
    print(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")
    print(f"- CUDA-flavor build: exit code {args.build_rc}, {args.build_seconds} s")
    for so in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "cutlass_nn", "_C*.so"))):
        print(f"- extension tested: {os.path.basename(so)}, md5 {md5(Path(so))}")
    try:
        with open(args.selftests) as f:
            for line in f:
                if line.startswith("== "):
                    name = line[3:].strip()
                m = re.match(r"^(\d+) passed, (\d+) failed", line)
                if m:
                    print(f"- kernel self-test {name}: {m.group(1)} passed, {m.group(2)} failed")
    except OSError:
        print("- kernel self-tests: no log")
    try:
        c = junit_counts(args.junit)
    except (OSError, ET.ParseError) as exc:
        print(f"- pytest: no report ({exc})")
        return
    passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    print(
        f"- pytest: {passed} passed, {c['failures']} failed, {c['errors']} errors, "
        f"{c['skipped']} skipped (of {c['tests']})"
    )
    for name in failed_names(args.junit):
        print(f"  - FAILED {name}")


if __name__ == "__main__":
    main()
