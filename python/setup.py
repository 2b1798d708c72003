"""pip install ./python: builds topocoll's Python package with the project's CMake (the C++ library and the
extension against Debian's PyTorch). Offline, with Debian's packages:

    python3 -m venv --system-site-packages .venv && .venv/bin/pip install --no-build-isolation ./python

TOPOCOLL_BUILD_DIR=<a configured build folder> reuses that build (only the extension's target is brought up to
date, nothing is reconfigured), as CI does; otherwise a fresh build folder is configured in pip's temporary tree.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("TOPOCOLL_BUILD_DIR")
        if build:
            build = os.path.abspath(build)
            if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
                raise RuntimeError(f"TOPOCOLL_BUILD_DIR={build}: not a configured CMake build folder")
        else:
            build = os.path.join(self.build_temp, "cmake")
            os.makedirs(build, exist_ok=True)
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DTOPOCOLL_BUILD_TESTS=OFF", "-DTOPOCOLL_BUILD_BENCH=OFF",
                                   "-DTOPOCOLL_BUILD_PYTHON=ON", f"-DTOPOCOLL_PYTHON={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "topocoll_py", "topocoll_cli",
                               "-j", str(os.cpu_count() or 2)])
        built = os.path.join(build, "python", "topocoll")
        so = [f for f in os.listdir(built) if f.startswith("_C") and f.endswith(".so")][0]
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(built, so), dest)
        # The planner CLI beside it, for `python3 -m topocoll` and the `topocoll` console script.
        bindir = os.path.join(os.path.dirname(dest), "_bin")
        os.makedirs(bindir, exist_ok=True)
        shutil.copy2(os.path.join(build, "topocoll"), os.path.join(bindir, "topocoll"))


setup(
    name="topocoll",
    version="0.1.0",
    description="Topology-aware collective communication: NCCL's planner and a torch.distributed backend",
    license="Apache-2.0",
    packages=["topocoll"],
    ext_modules=[Extension("topocoll._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["topocoll = topocoll.__main__:main"]},
    python_requires=">=3.9",
)
