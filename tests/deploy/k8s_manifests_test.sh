#!/usr/bin/env bash
# deploy/k8s/*.yaml parse and hang together (check_k8s.py). Needs Debian's
# /usr/bin/python3 with python3-yaml; skipped (exit 0, says so) without it.
set -euo pipefail
here="${TEST_SRCDIR}/${TEST_WORKSPACE}"
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 with the yaml module (python3-yaml) not available"
  exit 0
fi
exec /usr/bin/python3 "$here/tests/deploy/check_k8s.py" "$here"/deploy/k8s/*.yaml
