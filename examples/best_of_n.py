#!/usr/bin/env python3
"""Best-of-N with forks: prepare a sandbox once, fork it N ways, try a different approach in each
fork (they share the prepared state, not each other's changes), keep the best."""
from pandastack import Sandbox

N = 3
with Sandbox.create() as base:
    base.filesystem.write("/workspace/numbers.txt", "".join(f"{i}\n" for i in range(1, 101)))
    candidates = {
        "awk": "awk '{s+=$1} END {print s}' /workspace/numbers.txt",
        "python": "python3 -c 'print(sum(map(int, open(\"/workspace/numbers.txt\"))))'",
        "shell": "s=0; while read n; do s=$((s+n)); done < /workspace/numbers.txt; echo $s",
    }
    forks = base.fork(N)
    results = {}
    try:
        for (name, cmd), fork in zip(candidates.items(), forks):
            r = fork.exec(cmd)
            results[name] = (r.exit_code, r.stdout.strip(), r.duration_ms)
    finally:
        for fork in forks:
            fork.kill()
    good = {k: v for k, v in results.items() if v[0] == 0 and v[1] == "5050"}
    best = min(good, key=lambda k: good[k][2])
    for name, (code, out, ms) in results.items():
        print(f"{name:7} exit={code} out={out} {ms:.0f} ms")
    print("best:", best)
