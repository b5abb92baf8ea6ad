#!/usr/bin/env bash
# Installs moeshard's build dependencies from Debian 12 packages. Idempotent: when everything is
# already installed it prints nothing and touches nothing. Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libhwy-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev clang-format clang-tidy python3
  pybind11-dev python3-dev python3-numpy python3-pytest python3-pip python3-setuptools python3-wheel
  python3-torch  # docs/python.md compares the runtime with a PyTorch reference (large; accepted)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
