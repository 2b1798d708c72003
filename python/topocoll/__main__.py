"""python3 -m topocoll ARGS: the planner CLI (`topocoll plan ...`, `topocoll topo show ...`, `topocoll --help`).

Runs the `topocoll` program installed with the package (pip), else the one on PATH (the .deb, cmake --install).
"""
import os
import shutil
import sys


def _program():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "topocoll")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("topocoll")
    # Not the console script that runs this very function (pip's `topocoll` entry point) again.
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0]) and not os.environ.get("_TOPOCOLL_PY_CLI"):
        return found
    return None


def main():
    prog = _program()
    if prog is None:
        sys.stderr.write("python3 -m topocoll: the topocoll program is neither in the package (pip install) nor on "
                         "PATH (the .deb or cmake --install put it in <prefix>/bin)\n")
        return 2
    os.environ["_TOPOCOLL_PY_CLI"] = "1"
    os.execv(prog, [prog] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
