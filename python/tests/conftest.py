"""Shared fixtures: the CLI the Python results are compared with, and the preset names."""
import json
import os
import pathlib
import subprocess

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("MOESHARD_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
CLI = os.environ.get("MOESHARD_CLI", str(SOURCE_DIR / "build" / "src" / "cli" / "moeshard"))
PRESETS = sorted(p.stem for p in (SOURCE_DIR / "models").glob("*.json"))


class CliResult:
    def __init__(self, proc, command):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.command = command

    def json(self):
        return json.loads(self.stdout)

    def error(self):
        """The message after 'moeshard <command>: error: ' (None when there is none)."""
        prefix = f"moeshard {self.command}: error: "
        for line in self.stderr.splitlines():
            if line.startswith(prefix):
                return line[len(prefix):]
        return None


@pytest.fixture(scope="session")
def cli():
    if not os.path.exists(CLI):
        pytest.fail(f"the moeshard CLI is not at {CLI}: build it (scripts/build.sh) or set "
                    "MOESHARD_CLI")

    def run(*args):
        proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
        return CliResult(proc, args[0])

    return run
