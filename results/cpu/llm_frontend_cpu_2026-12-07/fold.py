"""Summarise a py-spy raw (folded) record: samples per function, inclusive (anywhere on the stack) and self (on top).

python3 results/cpu/llm_frontend_cpu_2026-12-07/fold.py spy_service_c64_folded.txt [TOP]
"""

import collections
import sys


def name(frame: str) -> str:
    """`function (path/file.py:line)` -> `function (file.py)`."""
    function, _, where = frame.partition(" (")
    return f"{function} ({where.split(':')[0].split('/')[-1]})" if where else function


def main() -> None:
    inclusive, own, total = collections.Counter(), collections.Counter(), 0
    with open(sys.argv[1]) as record:
        lines = record.read().splitlines()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        samples, frames = int(count), stack.split(";")
        total += samples
        for function in {name(frame) for frame in frames}:
            inclusive[function] += samples
        own[name(frames[-1])] += samples
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    print(f"{total} samples")
    print("-- inclusive")
    for function, samples in inclusive.most_common(top):
        print(f"{samples:6d} {100 * samples / total:5.1f}% {function}")
    print("-- self")
    for function, samples in own.most_common(25):
        print(f"{samples:6d} {100 * samples / total:5.1f}% {function}")


if __name__ == "__main__":
    main()
