"""Sum a numeric column of a CSV grouped by another column: python3 sum_by.py FILE GROUP VALUE."""

import csv
import sys
from collections import defaultdict

totals: dict[str, float] = defaultdict(float)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        totals[row[sys.argv[2]]] += float(row[sys.argv[3]])
for key in sorted(totals):
    print(f"{key},{totals[key]:g}")
