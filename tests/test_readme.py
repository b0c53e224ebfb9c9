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


def test_readme_documents_every_build_knob():
    text = (ROOT / "README.md").read_text()
    setup_py = (ROOT / "setup.py").read_text()
    knobs = set(re.findall(r'os\.environ\.get\("([A-Z_]+)"', setup_py))
    assert knobs, "setup.py reads no knob?"
    for knob in knobs | {"MAX_JOBS"}:
        assert f"`{knob}`" in text, f"{knob} is not documented in README.md"
