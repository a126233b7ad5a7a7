#!/usr/bin/env bash
# GPU discovery script for Spark (spark.executor.resource.gpu.discoveryScript, and
# spark.worker.resource.gpu.discoveryScript on standalone workers). Spark runs it when an executor starts and
# expects one JSON object on stdout naming the resource and the addresses it may hand to tasks:
#     {"name": "gpu", "addresses": ["0", "1"]}
# pyspark's pip package does not ship Spark's examples/src/main/scripts/getGpusResources.sh, hence this copy.
# No nvidia-smi or no GPU: an empty list, so Spark reports "needs 1 gpu, found 0" instead of a JSON parse error.
set -euo pipefail

addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
  # One GPU index per line; a failing nvidia-smi (driver not loaded) counts as no GPU.
  indices=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
  for index in $indices; do
    addresses+="${addresses:+, }\"${index}\""
  done
fi
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
