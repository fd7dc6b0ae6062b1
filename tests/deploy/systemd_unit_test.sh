#!/usr/bin/env bash
# deploy/gradsyncd.service: `systemd-analyze verify` accepts it without a
# single warning, and it keeps the properties deploy/README.md promises.
# scripts/setup installs systemd (systemd-analyze and the system's units):
# without them this test fails, naming what is missing, instead of skipping.
set -euo pipefail

unit="${TEST_SRCDIR}/${TEST_WORKSPACE}/deploy/gradsyncd.service"
[ -f "$unit" ] || { echo "FAIL: $unit not found"; exit 1; }

# Settings the deployment relies on, each an exact line of the unit.
for line in 'Type=notify' 'NotifyAccess=main' 'EnvironmentFile=-/etc/default/gradsyncd' \
    'Restart=on-failure' 'NoNewPrivileges=yes' 'ProtectSystem=strict' \
    'RuntimeDirectory=gradsync' 'RuntimeDirectoryMode=0750' 'User=gradsync' \
    'LogsDirectory=gradsync' 'LimitNOFILE=65536'; do
  grep -qxF "$line" "$unit" || { echo "FAIL: '$line' missing from gradsyncd.service"; exit 1; }
done
# No $GRADSYNCD_OPTS: gradsyncd reads the GRADSYNCD_* variables itself.
grep -qE '^ExecStart=/usr/local/bin/gradsyncd --socket /run/gradsync/[^ $]+$' "$unit" \
  || { echo "FAIL: ExecStart must only put the socket under /run/gradsync"; exit 1; }

# Every line of the flags file is a comment or GRADSYNCD_<FLAG>=VALUE.
default="${TEST_SRCDIR}/${TEST_WORKSPACE}/deploy/gradsyncd.default"
if grep -vE '^(#.*|GRADSYNCD_[A-Z0-9_]+=[^ ]+|)$' "$default"; then
  echo "FAIL: gradsyncd.default lines above are neither comments nor GRADSYNCD_<FLAG>=VALUE"
  exit 1
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "FAIL: systemd-analyze not installed (Debian's systemd; scripts/setup installs it)"
  exit 1
fi
units=""
for d in /usr/lib/systemd/system /lib/systemd/system; do
  if [ -f "$d/multi-user.target" ]; then units="$d"; break; fi
done
if [ -z "$units" ]; then
  echo "FAIL: no system unit directory (multi-user.target) to verify against: install systemd"
  exit 1
fi

# verify checks that ExecStart's binary exists and that every referenced
# unit does: a throw-away root with a stub gradsyncd and the host's units.
root="$(mktemp -d "${TEST_TMPDIR:-/tmp}/sdroot.XXXXXX")"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
printf '#!/bin/sh\nexit 0\n' > "$root/usr/local/bin/gradsyncd"
chmod 755 "$root/usr/local/bin/gradsyncd"
cp "$unit" "$root/etc/systemd/system/gradsyncd.service"
cp -a "$units" "$root/usr/lib/systemd/system"

status=0
out="$(systemd-analyze --root="$root" verify gradsyncd.service 2>&1)" || status=$?
if [ "$status" -ne 0 ] || [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify (exit $status):"
  echo "$out"
  exit 1
fi
echo "PASS: systemd-analyze verify accepts gradsyncd.service"
