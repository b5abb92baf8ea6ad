"""Builds moeshard._core through the project's CMake for `pip install .`.

The extension is the CMake target moeshard_python (python/CMakeLists.txt); this only configures a
build directory (build/pip, beside the developer build so ccache is shared), builds that target
for the running interpreter and copies the module where setuptools packages it.
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("MOESHARD_PIP_BUILD_DIR", ROOT / "build" / "pip"))
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPython3_EXECUTABLE={sys.executable}",
            "-DMOESHARD_PYTHON=ON", "-DMOESHARD_BUILD_TESTS=OFF", "-DMOESHARD_BUILD_BENCH=OFF",
            "-DMOESHARD_ENABLE_FUZZ=OFF", "-DMOESHARD_ENABLE_MPI=OFF",
        ]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                          "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("MOESHARD_JOBS", "2")
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "moeshard_python",
                        "-j", jobs], check=True)
        built = sorted((build_dir / "python" / "moeshard").glob("_core*.so"))
        if not built:
            raise RuntimeError(f"CMake built no moeshard/_core*.so under {build_dir}/python: "
                               "is MOESHARD_PYTHON on (pybind11-dev, python3-dev installed)?")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(ext_modules=[Extension("moeshard._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
