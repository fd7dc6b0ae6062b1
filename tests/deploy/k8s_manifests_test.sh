#!/usr/bin/env bash
# Each of deploy/k8s/*.yaml parses and hangs together, and the real gradsyncd accepts
# the sidecar's flags (check_k8s.py). Needs Debian's
# /usr/bin/python3 with python3-yaml (scripts/setup installs it); fails,
# naming what is missing, without it.
set -euo pipefail
here="${TEST_SRCDIR}/${TEST_WORKSPACE}"
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  echo "FAIL: /usr/bin/python3 with the yaml module (python3-yaml) not available: run scripts/setup"
  exit 1
fi
# One job per file: the embedded leader's and etcd's variants.
for manifest in "$here"/deploy/k8s/*.yaml; do
  /usr/bin/python3 "$here/tests/deploy/check_k8s.py" --gradsyncd="$here/daemon/gradsyncd" \
    "$manifest"
done
