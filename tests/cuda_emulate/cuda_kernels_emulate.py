#!/usr/bin/env python3
"""Turns CUDA kernel sources into host C++ for tests/cuda_emulate/cuda_kernels_emulate.cpp: every `k<<<grid, block, ...>>>(args)`
launch becomes `emu::launch(dim3(grid), dim3(block), [&]{ k(args); })` and moecore's own includes are dropped (the
harness includes them once). Usage: tests/cuda_emulate/cuda_kernels_emulate.py OUT.inc FILE.cu...; for `embedding_bwd.cu` and
`moe_permute.cu` only their kernels are kept (their CUB sorts and scans run on the host in the harness)."""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][A-Za-z_0-9]*(?:<[^<>]*>)?)<<<(.*?)>>>\(", re.S)


def transform(text: str) -> str:
    text = re.sub(r'#include "moecore/[a-z_/]+\.(?:cuh|h)"\n', "", text)
    text = re.sub(r"#include <cub/[a-z_/]+\.cuh>\n", "", text)
    out, i = [], 0
    while (m := LAUNCH.search(text, i)) is not None:
        out.append(text[i:m.start()])
        grid, block = [p.strip() for p in m.group(2).split(",")][:2]
        j, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        out.append(f"emu::launch(dim3({grid}), dim3({block}), [&] {{ {m.group(1)}({text[m.end():j - 1]}); }})")
        i = j
    out.append(text[i:])
    return "".join(out)


def main() -> None:
    parts = []
    for path in sys.argv[2:]:
        text = open(path).read()
        if path.endswith(("embedding_bwd.cu", "moe_permute.cu")):  # the kernels, not the CUB launchers
            text = text[text.index("namespace {"):text.index("}  // namespace\n") + len("}  // namespace\n")] + "}\n"
            text = "namespace moecore::launch {\n" + text
        parts.append(f"// ---- {path}\n{transform(text)}")
    open(sys.argv[1], "w").write("\n".join(parts))


if __name__ == "__main__":
    main()
