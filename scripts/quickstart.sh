#!/usr/bin/env bash
# The README's first command: install dependencies, build, put the Python module on the
# import path, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
scripts/python_path.sh  # `python3 -c "import moeshard"` works after this
scripts/demo.sh
