"""`tandem index compact` by merge policy against `--all`: a build of scale_10m's inputs plus its 100-change update
(the policy has nothing to do: one small clean segment), then a second update (100 added, 50 deleted), compacted by
the policy and with `--all` from that same base, each published with --out beside the root and removed after.

Prints, per mode: wall time, peak RSS (GNU time), the disk the new version adds beside the root (hard links counted
once), what the embedding store grew by, and the filesystem's peak use above the start. Usage (inputs from
bench/index/scale_10m.py, kept there):

    python -m bench.index.compact_policy --inputs /work/scale/inputs-1000000 --run /work/scale/compact44-1m
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_line
from bench.harness.runs import home_with_teacher
from bench.index.scale_10m import DiskPeak, build_args, disk_gb, timed, update_stage

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
    store = home / "embeddings"
    rows: dict[str, object] = {"cpu": cpu_line(), "root_gb": disk_gb(root), "store_gb": disk_gb(store)}
    if len(_current(root).get("segments") or []) < 3:
        rows["policy, one update"] = _compact(args.run, root, store, home, "policy-1", [])
        _second_update(args.inputs, args.run, root, home)
    for mode, flags in (("policy", []), ("all", ["--all"])):
        rows[mode] = _compact(args.run, root, store, home, mode, flags)
    json.dump(rows, sys.stdout, indent=1)
    print()


def _current(root: Path) -> dict:
    return json.loads((root / (root / "CURRENT").read_text().strip() / "manifest.json").read_text())


def _second_update(inputs: Path, run: Path, root: Path, home: Path) -> None:
    """A second segment: 100 new documents, 50 documents of the base deleted (none the first update deleted)."""
    n = len(json.loads((inputs / "ids.json").read_text()))
    first = set(np.random.default_rng(1).choice(n, 100, replace=False).tolist())  # scale_10m.update_stage's
    picked = [int(i) for i in np.random.default_rng(2).choice(n, 200, replace=False) if int(i) not in first][:50]
    changes = run / "changes-2.jsonl"
    with changes.open("w") as fh:
        for i in range(100):
            fh.write(json.dumps({"_id": f"extra{i}", "title": f"Extra {i}", "text": f"bede babe sibo extra {i}",
                                 "metadata": {"year": 2001, "tag": "y", "date": "2001-06-01T00:00:00Z"}}) + "\n")
        for i in picked:
            fh.write(json.dumps({"_id": f"doc{i}", "delete": True}) + "\n")
    stage = timed("update 2", ["index", "update", "--root", str(root), "--changes", str(changes), "--precision",
                               "auto"], home)
    log.info("second update: %.1f s", stage.seconds)


def _compact(run: Path, root: Path, store: Path, home: Path, mode: str, flags: list[str]) -> dict[str, object]:
    """`index compact` of CURRENT with `flags` into run/out-MODE (removed after): what it cost."""
    base = root / (root / "CURRENT").read_text().strip()
    out = run / f"out-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    stored, peak = disk_gb(store), DiskPeak(run)
    stage = timed(f"compact {mode}", ["index", "compact", "--base", str(base), "--out", str(out), *flags], home)
    row: dict[str, object] = {"seconds": stage.seconds, "peak_rss_gb": stage.peak_rss_gb, "disk_peak_gb": peak.stop(),
                              "store_adds_gb": disk_gb(store) - stored, "said": stage.note,
                              "base_segments": len(json.loads((base / "manifest.json").read_text()).get("segments")
                                                   or [None])}
    if (out / "manifest.json").exists():
        manifest = json.loads((out / "manifest.json").read_text())
        row.update(version_adds_gb=disk_gb(root, out) - disk_gb(root), count=manifest["count"],
                   segments=len(manifest.get("segments") or [None]))
        shutil.rmtree(out)
    log.info("%s: %s", mode, row)
    return row


if __name__ == "__main__":
    main()
