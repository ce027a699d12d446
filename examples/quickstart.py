#!/usr/bin/env python3
"""Create a sandbox, run code in it, move files in and out. PANDASTACK_API_KEY must be set."""
from pandastack import Sandbox

with Sandbox.create() as sbx:  # killed at the end of the block
    print(sbx.exec("python3 -c 'print(6 * 7)'").stdout, end="")
    sbx.filesystem.write("/workspace/data.csv", "a,b\n1,2\n3,4\n")
    r = sbx.exec(["python3", "-c",
                  "import csv; rows = list(csv.DictReader(open('/workspace/data.csv'))); "
                  "print(sum(int(r['b']) for r in rows))"])
    print("sum of b:", r.stdout.strip())
