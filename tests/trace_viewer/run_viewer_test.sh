#!/bin/sh
# Runs a 2-rank training job with --trace and loads its trace into speedscope (viewer_test.mjs).
#   run_viewer_test.sh CLI CONFIG DATA NODE OUT
# Exit status: viewer_test.mjs's (77: skipped), or 1 when the job fails.
set -eu
cli=$1 config=$2 data=$3 node=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)

rm -rf "$out"
mkdir -p "$out"
if ! "$cli" train --config "$config" --data "$data" --nproc 2 --epochs 1 --trace "$out/job.json"; then
  echo "FAIL: backplane train --trace exited with an error"
  exit 1
fi
exec "$node" "$here/viewer_test.mjs" "$out/job.json" --expect-ranks 2 --expect-span step --expect-span all_reduce
