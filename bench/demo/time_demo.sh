#!/usr/bin/env bash
# Times what `make demo` runs after install, phase by phase, in a TANDEM_HOME of the caller's choosing:
# `tandem models fetch`, then `tandem demo serve` until /readyz answers 200 (then the server is stopped).
# The demo's own log lines (timestamped) give the phases inside `demo serve`; load average is sampled every 5 s.
# usage: TANDEM_HOME=/some/home bench/demo/time_demo.sh LOGDIR [PORT [DEMO SERVE OPTIONS...]]
set -u
logdir=$1; port=${2:-18431}; shift; shift || true
mkdir -p "$logdir"
(while true; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done) > "$logdir/load.log" &
sampler=$!
start=$(date +%s.%N)
{ time tandem models fetch; } > "$logdir/fetch.log" 2>&1
fetched=$(date +%s.%N)
tandem demo serve --port "$port" "$@" > "$logdir/serve.log" 2>&1 &
server=$!
ready=""
while kill -0 "$server" 2>/dev/null; do
  if curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then ready=$(date +%s.%N); break; fi
  sleep 0.5
done
kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
kill "$sampler"
if [ -z "$ready" ]; then echo "the demo did not become ready; see $logdir/serve.log"; exit 1; fi
python3 - "$start" "$fetched" "$ready" <<'PY' | tee "$logdir/phases.txt"
import sys
start, fetched, ready = map(float, sys.argv[1:])
print(f"models fetch: {fetched - start:.1f} s; demo serve to ready: {ready - fetched:.1f} s; total {ready - start:.1f} s")
PY
