#!/usr/bin/env python3
"""The layer rule over the #include lines of src/moecore (docs/architecture.md, "The map"), run by CTest
(layer_check). Prints each include that breaks it and exits 1 if any:

1. A folder includes only folders at or above it in LAYERS: core never sees the GPU runtime, the kernels never see a
   module, nn never sees moe, and so on.
2. The kernels are one device-neutral API (kernels/*.h) with two backends behind it: nothing outside kernels/
   includes kernels/cpu/ or kernels/cuda/ headers; the backends do not include each other.
3. A module is written once for both devices: outside core/, device/ and kernels/, no code branches on the device
   (is_cuda(), is_cpu(), Device::cuda, DeviceType, #ifdef MOECORE_HAVE_CUDA) except inside the few named functions
   that decide what legitimately depends on it (DEVICE_DECISIONS: placing a rank on a GPU, the GPU transport, the
   device a command runs or plans on). Assertions (MOE_ASSERT, MOE_CHECK) may name the device anywhere.
"""
import pathlib
import re
import sys

LAYERS = ["core", "device", "kernels", "comm", "nn", "moe", "optim", "data", "ckpt", "train", "report", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"moecore/([^"]+)"')
DEVICE_BRANCH = re.compile(r"\bis_cuda\(\)|\bis_cpu\(\)|\bDevice::cuda\b|\bDeviceType::|\bkCuda\b|MOECORE_HAVE_CUDA")
DEVICE_FREE = ("core", "device", "kernels")  # where the device is chosen: Tensor, the GPU runtime, the kernel backends
# The functions (by name, wherever they are) that decide what depends on the device, one decision each.
DEVICE_DECISIONS = {
    "training_device": "the device --device trains on (train/config/device_support.cpp)",
    "place_this_rank": "a single process's GPU (train/trainer.cpp)",
    "place_ranks_on_gpus": "each rank's GPU and the transport between GPUs (comm/gpu_transport.cpp)",
    "nccl_for": "NCCL for GPU tensors (comm/process_group.cpp)",
    "on_gpu": "host-staged transport for GPU tensors (comm/process_group.cpp)",
    "planned_device": "the device a memory plan is for (train/memory_plan.cpp)",
    "plans_gpu": "whether that is a GPU (train/memory_plan.cpp)",
    "offloading_applies": "activation offloading needs device memory apart from the host's (train/config/device_support.cpp)",
    "run_bench_gemm": "--device: the GEMM benchmark of that device's backend (cli/bench/gemm.cpp)",
    "run_bench_attention": "--device: the attention benchmark of that device's kernels (cli/bench/attention.cpp)",
}
ASSERTION = re.compile(r"\bMOE_(ASSERT|CHECK)\w*\s*\(")
FUNCTION = re.compile(r"^(?:[\w:<>,&*~\[\]]+\s+)*?[\w:<>,&*]*?(\w+)\s*\(")


def layer_of(path):  # "kernels/cpu/gemm.h" -> "kernels"
    return path.split("/", 1)[0]


def backend_of(path):  # "kernels/cpu/gemm.h" -> "cpu"; an API header -> None
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "kernels" and parts[1] in ("cpu", "cuda") else None


def enclosing_function(lines, n, header):
    """The name of the function whose definition line n (0-based) is in: the nearest line above it that opens a
    definition at the outer indentation (in a header also a class's, two spaces)."""
    for i in range(n, -1, -1):
        line = lines[i].rstrip()
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if indent > (2 if header else 0) or not stripped or stripped.startswith(("//", "#", "}", "namespace")):
            continue
        m = FUNCTION.match(stripped)
        if m and not line.endswith(";") and line.endswith(("{", ",", "(", ")", "const")):
            return m.group(1)
    return None


def device_branches(rel, text):
    """The device branches of one file outside the named decisions, as messages."""
    if rel.split("/", 1)[0] in DEVICE_FREE:
        return []
    bad = []
    lines = text.splitlines()
    in_assertion = 0  # open parentheses of an assertion spanning lines
    for n, line in enumerate(lines):
        code = line.split("//", 1)[0]
        if in_assertion > 0:
            in_assertion += code.count("(") - code.count(")")
            continue
        a = ASSERTION.search(code)
        if a:
            rest = code[a.start():]
            depth = rest.count("(") - rest.count(")")
            if depth > 0:
                in_assertion = depth
            code = code[: a.start()]
        if not DEVICE_BRANCH.search(code):
            continue
        fn = enclosing_function(lines, n, rel.endswith(".h"))
        if fn in DEVICE_DECISIONS:
            continue
        bad.append(f"{rel}:{n + 1}: branches on the device in {fn or 'file scope'}(); move the math or the copy into a "
                   f"kernel op (kernels/), or the decision into one of scripts/check-layers.py DEVICE_DECISIONS")
    return bad


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
        text = f.read_text(encoding="utf-8")
        bad += device_branches(rel, text)
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            there = layer_of(inc)
            if there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{rel}:{n}: {here}/ includes {inc}, a higher layer ({there}/)")
            b_here, b_there = backend_of(rel), backend_of(inc)
            if b_there and here != "kernels":
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
        "nn/e.cpp": "Tensor f(const Tensor& x) {\n  if (x.device().is_cuda()) return g(x);\n  return x;\n}",  # a branch
        "comm/f.cpp": "bool on_gpu(const Tensor& t) {\n  return t.device().is_cuda();\n}",  # allowed: a decision
        "moe/g.cpp": "void h(const Tensor& x) {\n  MOE_ASSERT(x.device().is_cuda() ||\n             true);\n}",  # allowed
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in cases.items():
            f = pathlib.Path(tmp, "src", "moecore", rel)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text + "\n")
        found = {b.split(":", 1)[0] for b in check(pathlib.Path(tmp))}
    want = {"core/a.h", "kernels/cpu/b.cpp", "nn/c.cpp", "nn/e.cpp"}
    if found != want:
        print(f"layers: self-test found {sorted(found)}, expected {sorted(want)}")
        return 1
    print("layers: self-test: the three kinds of broken include and the device branch are found, the allowed ones pass")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = check(root)
    for b in bad:
        print("layers:", b)
    if bad:
        print(f"layers: {len(bad)} include(s) or device branch(es) break the layer rule (docs/architecture.md, The map)")
        return 1
    print("layers: every #include and device branch under src/moecore follows the layer rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
