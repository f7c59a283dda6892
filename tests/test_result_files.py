"""Every file under ``benchmarks/results/`` says how to make it again: it
starts with the exact command (a committed script under
``benchmarks/scripts/``) and the commit it ran at, with no uncommitted
changes; a JSON file carries the two as its first keys."""

import json
import pathlib
import re
import subprocess

import pytest

pytestmark = pytest.mark.pure

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").iterdir())
COMMAND = re.compile(r"python (benchmarks/(?:scripts/)?\w+\.py)( .*)?")
COMMIT = re.compile(r"[0-9a-f]{40}")


def header(path: pathlib.Path):
    """(command, commit) as the file states them."""
    if path.suffix == ".json":
        keys = list(json.loads(path.read_text()))[:2]
        assert keys == ["command", "commit"], f"{path.name}: first keys {keys}"
        data = json.loads(path.read_text())
        return data["command"], data["commit"]
    assert path.suffix == ".md", f"{path.name}: results are .md or .json"
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "", f"{path.name}: a title, then a blank line"
    command = re.fullmatch(r"Command: `(.*)`", lines[2])
    commit = re.fullmatch(r"Commit: (.*)", lines[3])
    assert command and commit, f"{path.name}: lines 3-4 are Command: `...` and Commit: ..."
    return command.group(1), commit.group(1)


def git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_result_file_names_its_command_and_a_clean_commit(path):
    command, commit = header(path)
    script = COMMAND.fullmatch(command)
    assert script, f"{path.name}: {command!r} does not run a script under benchmarks/"
    assert COMMIT.fullmatch(commit), f"{path.name}: {commit!r} is not a commit without local changes"
    if (
        f"--out benchmarks/results/{path.name}" not in command
        and f"--json benchmarks/results/{path.name}" not in command
    ):
        pytest.fail(f"{path.name}: its command writes another file")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "false":  # a full clone: check it
        shown = git("cat-file", "-e", f"{commit}:{script.group(1)}")
        assert shown.returncode == 0, f"{path.name}: {script.group(1)} is not in commit {commit}"


def test_there_are_results_to_check():
    assert len(RESULTS) >= 10
