"""Print the test files of one part of the suite, so ``make test`` can run a backend's
suite as several pytest processes at once (each against a database of its own).

    python tests/shard.py PARTS PART      # PART counts from 1

The files are dealt out largest first, each to the part with the least so far (file size
stands in for run time: the long tests are the ones with workers and many cases), so every
file is in exactly one part and the parts take about as long. Stable for a given tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def parts(count: int) -> list[list[str]]:
    files = sorted(TESTS.glob("test_*.py"), key=lambda p: (-p.stat().st_size, p.name))
    dealt: list[list[str]] = [[] for _ in range(count)]
    sizes = [0] * count
    for path in files:
        smallest = sizes.index(min(sizes))
        dealt[smallest].append(f"tests/{path.name}")
        sizes[smallest] += path.stat().st_size
    return [sorted(files) for files in dealt]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(a.isdigit() for a in argv) or not 1 <= int(argv[1]) <= int(argv[0]):
        print("usage: python tests/shard.py PARTS PART (1 <= PART <= PARTS)", file=sys.stderr)
        return 2
    print(" ".join(parts(int(argv[0]))[int(argv[1]) - 1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
