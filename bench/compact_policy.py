"""`tandem index compact` by merge policy against `--all`, on one base: a build of scale_10m's inputs plus its
100-change update, each compaction published with --out beside the root (the same base for both).

Prints, per mode: wall time, peak RSS (GNU time), the disk the new version adds beside the root (hard links counted
once), what the embedding store grew by, and the filesystem's peak use above the start. Usage (inputs from
bench/scale_10m.py, kept there):

    python bench/compact_policy.py --inputs /work/scale/inputs-1000000 --run /work/scale/compact44-1m
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

from benchdoc import cpu_line
from scale_10m import DiskPeak, build_args, disk_gb, home_with_teacher, timed, update_stage

log = logging.getLogger("compact_policy")


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--index", default="auto")
    args = parser.parse_args(argv)
    args.run.mkdir(parents=True, exist_ok=True)
    home = home_with_teacher(args.run / "home")
    root = args.run / "root"
    if not (root / "CURRENT").exists():
        build = timed("build", [*build_args(args.inputs, args.index), "--root", str(root)], home)
        log.info("build: %.1f s, %.2f GB RSS, root %.2f GB", build.seconds, build.peak_rss_gb, disk_gb(root))
        update = update_stage(args.inputs, root, args.run, home)
        log.info("update: %.1f s", update.seconds)
    base = root / (root / "CURRENT").read_text().strip()
    store = home / "embeddings"
    rows = {"cpu": cpu_line(), "root_gb": disk_gb(root), "store_gb": disk_gb(store)}
    for mode, flags in (("policy", []), ("all", ["--all"])):
        out = args.run / f"out-{mode}"
        shutil.rmtree(out, ignore_errors=True)
        stored, peak = disk_gb(store), DiskPeak(args.run)
        stage = timed(f"compact {mode}", ["index", "compact", "--base", str(base), "--out", str(out), *flags], home)
        manifest = json.loads((out / "manifest.json").read_text())
        rows[mode] = {"seconds": stage.seconds, "peak_rss_gb": stage.peak_rss_gb, "disk_peak_gb": peak.stop(),
                      "version_adds_gb": disk_gb(root, out) - disk_gb(root), "store_adds_gb": disk_gb(store) - stored,
                      "segments": len(manifest.get("segments") or [None]), "count": manifest["count"]}
        log.info("%s: %s", mode, rows[mode])
        shutil.rmtree(out)
    json.dump(rows, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
