#!/usr/bin/env python3
"""The layer rule over the #include lines of src/moecore (docs/architecture.md, "The map"), run by CTest
(layer_check). Prints each include that breaks it and exits 1 if any:

1. A folder includes only folders at or above it in LAYERS: core never sees the GPU runtime, the kernels never see a
   module, nn never sees moe, and so on.
2. The kernels are one device-neutral API (kernels/*.h) with two backends behind it: outside kernels/, only
   cli/bench (which times a backend by name) includes kernels/cpu/ or kernels/cuda/ headers; the backends do not
   include each other.
"""
import pathlib
import re
import sys

LAYERS = ["core", "device", "kernels", "comm", "nn", "moe", "optim", "data", "ckpt", "train", "report", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"moecore/([^"]+)"')


def layer_of(path):  # "kernels/cpu/gemm.h" -> "kernels"
    return path.split("/", 1)[0]


def backend_of(path):  # "kernels/cpu/gemm.h" -> "cpu"; an API header -> None
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "kernels" and parts[1] in ("cpu", "cuda") else None


def check(root):
    src = root / "src" / "moecore"
    bad = []
    for f in sorted(src.rglob("*")):
        if f.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        rel = f.relative_to(src).as_posix()
        here = layer_of(rel)
        if here not in LAYERS:
            bad.append(f"{rel}: folder '{here}' is not in the layer list (scripts/check-layers.py LAYERS)")
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            there = layer_of(inc)
            if there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{rel}:{n}: {here}/ includes {inc}, a higher layer ({there}/)")
            b_here, b_there = backend_of(rel), backend_of(inc)
            if b_there and here != "kernels" and not rel.startswith("cli/bench/"):
                bad.append(f"{rel}:{n}: includes the {b_there} backend's {inc}; include the API header kernels/*.h")
            if b_there and b_here and b_here != b_there:
                bad.append(f"{rel}:{n}: the {b_here} backend includes the {b_there} backend's {inc}")
    return bad


def self_test():
    """The rule on a made-up tree with one include of each kind it refuses, and one it allows."""
    import tempfile
    cases = {
        "core/a.h": '#include "moecore/device/runtime.h"',  # core sees the GPU runtime
        "kernels/cpu/b.cpp": '#include "moecore/kernels/cuda/kernels.h"',  # backend to backend
        "nn/c.cpp": '#include "moecore/kernels/cpu/gemm.h"',  # a module past the API
        "moe/d.cpp": '#include "moecore/nn/linear.h"',  # allowed: nn is above moe
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in cases.items():
            f = pathlib.Path(tmp, "src", "moecore", rel)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text + "\n")
        found = {b.split(":", 1)[0] for b in check(pathlib.Path(tmp))}
    want = {"core/a.h", "kernels/cpu/b.cpp", "nn/c.cpp"}
    if found != want:
        print(f"layers: self-test found {sorted(found)}, expected {sorted(want)}")
        return 1
    print("layers: self-test: the three kinds of broken include are found, the allowed one passes")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = check(root)
    for b in bad:
        print("layers:", b)
    if bad:
        print(f"layers: {len(bad)} include(s) break the layer rule (docs/architecture.md, The map)")
        return 1
    print("layers: every #include under src/moecore follows the layer rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
