"""README.md is the user's door: its commands must be the ones CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = readme_commands()
    test_command = next(c for c in commands if "pytest" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines, f"{test_command!r} is not a line of .ci/run"


def test_readme_main_job_runs_the_training_example():
    commands = readme_commands()
    assert any("training_examples/train_mlp.py" in c and "scripts/setup.sh" in c for c in commands)
    assert (ROOT / "training_examples" / "train_mlp.py").is_file()


def environ_knobs(*paths: pathlib.Path) -> set[str]:
    return {
        knob
        for path in paths
        for knob in re.findall(r'os\.environ\.get\("([A-Z_]+)"', path.read_text())
    }


#: the package's modules that only the build reads (their variables are build knobs)
BUILD_MODULES = [ROOT / "cutlass_nn" / "_build_config.py", ROOT / "cutlass_nn" / "_object_cache.py"]


def test_readme_documents_every_build_knob():
    text = (ROOT / "README.md").read_text()
    # setup.py, the build description it shares with the JIT build, and its object cache
    knobs = environ_knobs(*[ROOT / "setup.py", *BUILD_MODULES])
    assert {"CUTLASS_NN_CUDA_ARCHS", "CUTLASS_DIR"} <= knobs, knobs
    for knob in knobs | {"MAX_JOBS"}:
        assert f"`{knob}`" in text, f"{knob} is not documented in README.md"


def test_readme_documents_every_runtime_knob():
    text = (ROOT / "README.md").read_text()
    runtime = text[text.index("### Runtime environment variables") :]
    package = sorted((ROOT / "cutlass_nn").glob("*.py"))
    knobs = environ_knobs(*[p for p in package if p not in BUILD_MODULES])
    assert "CUTLASS_NN_JIT" in knobs, knobs
    # and the extension's own (read with std::getenv in C++)
    native = {
        knob
        for path in sorted((ROOT / "csrc").rglob("*"))
        if path.suffix in (".cpp", ".cu", ".h", ".cuh")
        for knob in re.findall(r'getenv\("([A-Z_]+)"\)', path.read_text())
    }
    assert "CUTLASS_NN_PDL" in native, native
    knobs |= native
    for knob in knobs:
        assert f"`{knob}`" in runtime, f"{knob} is not documented as a runtime variable in README.md"
