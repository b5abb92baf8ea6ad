#!/usr/bin/env bash
# Cross-builds the kernels for 64-bit Arm (Debian 12's g++-aarch64-linux-gnu and the arm64
# packages of the libraries) and runs the kernels tests that need no second thread under
# qemu-aarch64, each with a time limit. Not part of CI: it adds the arm64 architecture to dpkg and
# installs about 300 MB. The NEON variant is what runs there (SupportedCpuIsas: neon, portable).
# On the project's VM qemu-user hangs on any program that starts a thread, so a test that
# starts one is reported as "timeout", not as a failure.
#   scripts/check_arm64.sh [build dir, default build-arm64] [seconds per test, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-arm64}
limit=${2:-60}
sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
  "${sudo_cmd[@]}" apt-get update -qq
fi
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq g++-aarch64-linux-gnu \
  qemu-user libhwy-dev:arm64 libfmt-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 \
  nlohmann-json3-dev libcli11-dev >/dev/null
cmake -S . -B "$dir" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESHARD_BUILD_BENCH=OFF -DMOESHARD_ENABLE_MPI=OFF \
  -DMOESHARD_ENABLE_FUZZ=OFF -DMOESHARD_PYTHON=OFF >/dev/null
ninja -C "$dir" -j2 kernels_test
run=(qemu-aarch64 -L /usr/aarch64-linux-gnu "$dir/src/kernels/kernels_test")
passed=0 failed=0 timed_out=0
suite=""
while IFS= read -r line; do
  if [[ $line != " "* ]]; then
    suite=$line
    continue
  fi
  test=${line#"${line%%[! ]*}"}  # without its indent
  name="$suite${test%% *}"
  set +e
  timeout "$limit" "${run[@]}" --gtest_filter="$name" >/dev/null 2>&1
  rc=$?
  set -e
  case $rc in
    0) passed=$((passed + 1)) ;;
    124) timed_out=$((timed_out + 1)); echo "timeout: $name" ;;
    *) failed=$((failed + 1)); echo "FAILED: $name" ;;
  esac
done < <("${run[@]}" --gtest_list_tests | tail -n +2)
echo "arm64 kernels_test under qemu: $passed passed, $failed failed, $timed_out timed out"
[[ $failed -eq 0 ]]
