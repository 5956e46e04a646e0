"""Registers, shared memory, stack and spills of every CUDA kernel, per architecture, from ptxas.

    python bench/ptxas_report.py [--arch 80 90] [--check]

Compiles each csrc/cuda/*.cu with the build's CUDA flags (-O3 --expt-relaxed-constexpr, C++17) for
each architecture, reads the launch bound of every kernel from the PTX (`.maxntid`) and its resource
use from `ptxas -v`, and prints one markdown row per kernel and architecture (the table in
docs/cuda_kernels.md). `--check` fails when a kernel has no `__launch_bounds__` or when its
registers times its launch bound exceed the 64K-register file of one SM: such a launch fails on
the device with "too many resources requested" (the emulator cannot see it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGS_PER_SM = 65536
FLAGS = ["-O3", "--expt-relaxed-constexpr", "-std=c++17", "-Werror=all-warnings"]


def nvcc() -> str | None:
    return os.environ.get("CUDACXX") or shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}
    # the kernel's own name with its template arguments, without namespaces or parameters
    short = []
    for d in out.splitlines():
        d = re.sub(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::", "", d)
        short.append(d.removeprefix("void ").split("(", 1)[0])
    return dict(zip(names, short))


def compile_one(cu: Path, arch: int, compiler: str) -> list[dict]:
    """Resource rows of every kernel of one .cu file for one architecture."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [compiler, *FLAGS, f"-I{ROOT / 'csrc'}", f"-arch=sm_{arch}", "-Xptxas", "-v", "-c", str(cu),
               "-o", os.path.join(tmp, "k.o"), "-keep", "-keep-dir", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed on {cu.name} (sm_{arch}):\n{res.stderr}")
        ptx = "".join(p.read_text() for p in Path(tmp).glob("*.ptx"))
    bounds = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"\.entry\s+(\S+)\(.*?\)\s*(?:\.maxntid\s+(\d+))?", ptx, re.S) if m.group(2)}
    entries = re.findall(r"\.entry\s+(\S+)\(", ptx)
    rows: dict[str, dict] = {}
    cur = None
    for line in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_(\d+)'", line)
        if m:
            cur = rows.setdefault(m.group(1), {"name": m.group(1), "file": cu.name, "arch": arch})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            sm = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(sm.group(1)) if sm else 0
    for e in entries:
        rows.setdefault(e, {"name": e, "file": cu.name, "arch": arch})
        rows[e]["bound"] = bounds.get(e)
    return list(rows.values())


def report(archs=(80, 90)) -> list[dict]:
    compiler = nvcc()
    if compiler is None:
        raise RuntimeError("no nvcc (set CUDACXX)")
    jobs = [(cu, a) for cu in sorted((ROOT / "csrc" / "cuda").glob("*.cu")) for a in archs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        rows = [r for rs in ex.map(lambda j: compile_one(j[0], j[1], compiler), jobs) for r in rs]
    names = demangle(sorted({r["name"] for r in rows}))
    for r in rows:
        r["kernel"] = names[r["name"]]
    return sorted(rows, key=lambda r: (r["file"], r["kernel"], r["arch"]))


def problems(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        where = f"{r['file']}: {r['kernel']} (sm_{r['arch']})"
        if r.get("bound") is None:
            out.append(f"{where}: no __launch_bounds__")
        elif r.get("regs", 0) * r["bound"] > REGS_PER_SM:
            out.append(f"{where}: {r['regs']} registers x {r['bound']} threads > {REGS_PER_SM}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="SM architectures (default: 80 90)")
    ap.add_argument("--check", action="store_true", help="fail on a kernel without launch bounds or over the SM's registers")
    args = ap.parse_args()
    rows = report(tuple(args.arch))
    # one row per kernel and architecture: the largest use over its template instantiations
    agg: dict[tuple, dict] = {}
    for r in rows:
        k = (r["file"], r["kernel"].split("<", 1)[0], r["arch"])
        a = agg.setdefault(k, {"n": 0, "bound": r.get("bound"), "regs": 0, "smem": 0, "stack": 0, "spill": 0})
        a["n"] += 1
        a["regs"] = max(a["regs"], r.get("regs", 0))
        a["smem"] = max(a["smem"], r.get("smem", 0))
        a["stack"] = max(a["stack"], r.get("stack", 0))
        a["spill"] = max(a["spill"], r.get("spill_st", 0) + r.get("spill_ld", 0))
    print("| file | kernel (instantiations) | sm | launch bound | registers (max) | regs x bound | static smem (B) "
          "| stack (B) | spills (B) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (f, k, arch), a in sorted(agg.items()):
        b = a["bound"]
        print(f"| {f} | `{k}` ({a['n']}) | {arch} | {b or '-'} | {a['regs']} | {a['regs'] * b if b else '-'} "
              f"| {a['smem']} | {a['stack']} | {a['spill']} |")
    bad = problems(rows)
    for b in bad:
        print("PROBLEM:", b, file=sys.stderr)
    return 1 if (args.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
