#!/usr/bin/env python3
"""scripts/check_format.sh must fail on a file clang-format would change and pass once it is
formatted: it runs the script in a small git repository written here, with the project's
.clang-format."""
import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]


def main():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "scripts").mkdir()
        shutil.copy(REPO / "scripts" / "check_format.sh", root / "scripts")
        shutil.copy(REPO / ".clang-format", root)
        (root / "src").mkdir()
        (root / "src" / "bad.cc").write_text("int  f( int x ){return x+1;}\n")
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "."], cwd=root, check=True)
        check = [str(root / "scripts" / "check_format.sh")]
        bad = subprocess.run(check, capture_output=True, text=True)
        if bad.returncode != 1 or "src/bad.cc: not clang-formatted" not in bad.stdout:
            print(f"FAIL unformatted file accepted: rc {bad.returncode}\n{bad.stdout}{bad.stderr}")
            return 1
        subprocess.run(check + ["--fix"], check=True)
        good = subprocess.run(check, capture_output=True, text=True)
        if good.returncode != 0:
            print(f"FAIL formatted file rejected: rc {good.returncode}\n{good.stdout}{good.stderr}")
            return 1
    print("ok   unformatted file rejected, formatted file accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
