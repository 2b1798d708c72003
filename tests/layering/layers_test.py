#!/usr/bin/env python3
"""Every pair of layers: data flows one way.

Reads the layer order (TOPOCOLL_LAYERS in CMakeLists.txt) and each layer's DEPS and HEADERS (src/<layer>/CMakeLists.txt),
then checks, for every layer and every other layer:
  - a layer depends only on layers before it in the order (so the layers form one direction, top to bottom);
  - every `#include "topocoll/..."` in a layer's sources and public headers names its own headers or those of a layer
    it depends on (the build enforces this too: a layer's include path holds only its DEPS' headers; this test names
    the file and line, and covers headers no source of the layer includes).
Prints the include matrix (row includes column). Usage: layers_test.py SOURCE_DIR
"""
import os
import re
import sys


def parse_layer(cmake_text):
    m = re.search(r"topocoll_layer\(\s*(\w+)(.*?)\)", cmake_text, re.S)
    name, body = m.group(1), m.group(2)
    sections, key = {}, None
    for word in body.split():
        if word in ("SOURCES", "HEADERS", "DEPS", "EXTERNAL"):
            key = word
            sections[key] = []
        elif key:
            sections[key].append(word)
    return name, sections.get("HEADERS", []), sections.get("DEPS", [])


def main():
    root = sys.argv[1]
    top = open(os.path.join(root, "CMakeLists.txt")).read()
    order = re.search(r"set\(TOPOCOLL_LAYERS ([^)]*)\)", top).group(1).split()
    headers, deps = {}, {}
    for layer in order:
        name, h, d = parse_layer(open(os.path.join(root, "src", layer, "CMakeLists.txt")).read())
        assert name == layer, f"src/{layer}/CMakeLists.txt declares layer {name}"
        headers[layer], deps[layer] = h, d
    owner = {}  # include/topocoll entry (folder or file) -> layer
    for layer, hs in headers.items():
        for h in hs:
            owner[h] = layer
    failures = []
    for i, layer in enumerate(order):
        for d in deps[layer]:
            if d not in order[:i]:
                failures.append(f"src/{layer}/CMakeLists.txt: {layer} depends on {d}, which is not below it")
    include_re = re.compile(r'^\s*#\s*include\s+"topocoll/([^"]+)"')
    matrix = {layer: set() for layer in order}
    for layer in order:
        files = []
        for base in [os.path.join(root, "src", layer)] + [os.path.join(root, "include", "topocoll", h)
                                                           for h in headers[layer]]:
            if os.path.isfile(base):
                files.append(base)
            for dirpath, _, names in os.walk(base):
                files += [os.path.join(dirpath, n) for n in names if n.endswith((".h", ".cc", ".cu", ".inc"))]
        for path in files:
            for lineno, line in enumerate(open(path, errors="replace"), 1):
                m = include_re.match(line)
                if not m:
                    continue
                target = m.group(1)
                entry = target.split("/")[0] if "/" in target else target
                if entry == "version.h":  # generated into common's include folder
                    entry_layer = "common"
                else:
                    entry_layer = owner.get(entry)
                if entry_layer is None:
                    failures.append(f"{os.path.relpath(path, root)}:{lineno}: includes {target}, which no layer owns")
                    continue
                if entry_layer != layer:
                    matrix[layer].add(entry_layer)
                    if entry_layer not in deps[layer]:
                        failures.append(f"{os.path.relpath(path, root)}:{lineno}: layer {layer} includes {target} "
                                        f"of layer {entry_layer}, which is not among its DEPS {deps[layer]}")
    width = max(len(x) for x in order)
    print(" " * (width + 1) + " ".join(x[:4].ljust(4) for x in order))
    for layer in order:
        print(layer.ljust(width) + " " + " ".join(("  x " if x in matrix[layer] else "  . ") for x in order))
    for f in failures:
        print("FAIL " + f)
    print(f"{len(order) * (len(order) - 1)} pairs of layers checked, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
