#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
scripts/demo.sh
