"""Disk of an imported build: run `tandem ARGS` and sample, every 0.1 s, the bytes allocated under each watched
directory (the embedding store, the root); print their peaks and final sizes, and the wall time, as JSON.

    python -m bench.index.import_disk --watch STORE --watch ROOT -- index build ... --store STORE --root ROOT

Allocated bytes (st_blocks), so a sparse scratch file counts what was written, and a hard link to a file outside
the watched directories counts in each watched one that holds a name of it, once per inode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def allocated(directory: Path) -> int:
    seen: set[int] = set()
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            try:
                stat = os.lstat(os.path.join(parent, name))
            except FileNotFoundError:
                continue  # renamed or removed while walking
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                total += stat.st_blocks * 512
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=Path, action="append", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    peaks = {str(d): 0 for d in opts.watch}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for d in opts.watch:
                peaks[str(d)] = max(peaks[str(d)], allocated(d) if d.exists() else 0)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "tandem", *args])
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    final = {str(d): allocated(d) for d in opts.watch}
    print(json.dumps({"rc": rc, "wall_s": round(wall, 1), "peak_bytes": peaks, "final_bytes": final}))


if __name__ == "__main__":
    main()
