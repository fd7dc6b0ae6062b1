#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU: every script parses, the plan runs
# the items in the issue's order under the budget logic (a grant is
# min(limit, time left), an item that cannot get its minimum is
# SKIPPED-BUDGET, a failed canary stops everything), the summary and the
# JSON are written under $OUT, a bundle lacking a program fails its item,
# and a real run on a machine without a GPU stops within seconds, saying so.
set -uo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
check="$root/scripts/gpu-check.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu-check-plan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for f in "$check" "$root"/tests/gpu/check/*.sh; do
  bash -n "$f" || fail "$f does not parse"
done
for f in "$root"/tests/gpu/check/*.py; do
  python3 -m py_compile "$f" 2>"$tmp/py.err" || fail "$f: $(cat "$tmp/py.err")"
done

# A plan with room for everything: every item planned, in order.
out=$tmp/all
OUT=$out GPU_CHECK_BUDGET_S=5000 bash "$check" --dry-run > "$tmp/all.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "a plan with room for everything exited $rc: $(cat "$tmp/all.txt")"
order=$(awk '/^== summary/ {s = 1; getline; next} /^gpu-check:/ {s = 0} s && NF {print $1}' "$tmp/all.txt" | tr '\n' ' ')
want="preflight canary unit:nccl_loader unit:cuda_status unit:cuda_device_switch unit:nccl_collectives unit:cuda_device cabi cabi:event-pool two-nodes:equivalence two-nodes:never-joins two-nodes:skip torch killed broadcast elastic bench "
[ "$order" = "$want" ] || fail "items in the order '$order', want '$want'"
[ "$(grep -cE '^[^ ]+ +PLANNED ' "$tmp/all.txt")" -eq 17 ] || fail "not every item was planned: $(cat "$tmp/all.txt")"
[ -s "$out/gpu-check.log" ] || fail "no $out/gpu-check.log"
grep -q '^== summary' "$out/gpu-check.log" || fail "the log lacks the summary"
python3 - "$out/gpu-check.json" <<'PY' || fail "bad results JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["plan_only"] is True and r["budget_s"] == 5000, r
assert [i["result"] for i in r["items"]] == ["PLANNED"] * 17, r["items"]
assert r["items"][-1]["item"] == "bench" and r["bench"] is None, r
PY

# A tight budget: each item taken to last 30 s of a 100 s budget (5 s kept
# for the kill): preflight 0-30, canary 30-60, unit:nccl_loader gets
# min(15, 35) = 15 (60-90); then 5 s are left, under the 10 s minimum.
out=$tmp/tight
OUT=$out GPU_CHECK_BUDGET_S=100 GPU_CHECK_PLAN_ITEM_S=30 bash "$check" --dry-run > "$tmp/tight.txt" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "a budget that skips items exited $rc, want 3"
python3 - "$out/gpu-check.json" <<'PY' || fail "tight budget: $(cat "$tmp/tight.txt")"
import json, sys
items = {i["item"]: i for i in json.load(open(sys.argv[1]))["items"]}
assert items["preflight"]["granted_s"] == 40 and items["preflight"]["result"] == "PLANNED"
assert items["canary"]["granted_s"] == 45 and items["canary"]["result"] == "PLANNED"
assert items["unit:nccl_loader"]["granted_s"] == 15, items["unit:nccl_loader"]
assert items["unit:nccl_loader"]["seconds"] == 30, items["unit:nccl_loader"]
skipped = [n for n, i in items.items() if i["result"] == "SKIPPED-BUDGET"]
assert skipped == list(items)[3:], skipped
assert items["bench"]["detail"] == "5s left", items["bench"]
PY

# The default budget leaves the benchmark last: it is the one to lose time.
# 17 items of 19 s fit 330 s (less the 5 s kill grace); 20 s would not.
GPU_CHECK_PLAN_ITEM_S=19 bash "$check" --dry-run > "$tmp/default.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "the default budget with 19 s items exited $rc: $(cat "$tmp/default.txt")"
grep -q 'budget 330 s' "$tmp/default.txt" || fail "the default budget is not 330 s"

# A failed canary stops everything after it.
GPU_CHECK_PLAN_FAIL=canary GPU_CHECK_PLAN_ITEM_S=1 bash "$check" --dry-run > "$tmp/canary.txt" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "a failed canary exited $rc, want 2"
grep -qE '^canary +FAIL' "$tmp/canary.txt" || fail "canary not FAIL: $(cat "$tmp/canary.txt")"
[ "$(grep -cE ' NOT-RUN +0 +canary failed' "$tmp/canary.txt")" -eq 15 ] ||
  fail "items after the canary were not NOT-RUN: $(cat "$tmp/canary.txt")"
# A failed unit test does not.
GPU_CHECK_PLAN_FAIL=unit:cuda_status GPU_CHECK_PLAN_ITEM_S=1 bash "$check" --dry-run > "$tmp/unit.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "a failed unit test exited $rc, want 1"
grep -qE '^bench +PLANNED' "$tmp/unit.txt" || fail "a failed unit test stopped the run"

# A bundle that lacks programs: the items needing them fail, naming them.
mkdir -p "$tmp/bundle/bin" "$tmp/bundle/check"
echo "commit: test" > "$tmp/bundle/MANIFEST"
touch "$tmp/bundle/bin/gradsyncd"
GPU_CHECK_PLAN_ITEM_S=1 bash "$check" --dry-run "$tmp/bundle" > "$tmp/bundle.txt" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "a bundle without cuda_trainer exited $rc, want 2 (the canary needs it)"
grep -q 'canary: the bundle lacks bin/cuda_trainer' "$tmp/bundle.txt" ||
  fail "the missing program is not named: $(cat "$tmp/bundle.txt")"

# Not a bundle; and a real run without a GPU: exit 2 within seconds, saying why.
bash "$check" "$tmp/nothing" > "$tmp/nob.txt" 2>&1
[ $? -eq 2 ] && grep -q 'is not a bundle' "$tmp/nob.txt" || fail "a non-bundle: $(cat "$tmp/nob.txt")"
if nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "a GPU is visible here: the no-GPU run is not checked"
else
  start=$(date +%s)
  OUT=$tmp/nogpu timeout 60 bash "$check" "$tmp/bundle" > "$tmp/nogpu.txt" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "without a GPU it exited $rc, want 2: $(cat "$tmp/nogpu.txt")"
  grep -q 'no NVIDIA GPU is visible' "$tmp/nogpu.txt" || fail "no clear message: $(cat "$tmp/nogpu.txt")"
  [ $(($(date +%s) - start)) -lt 30 ] || fail "without a GPU it took $(($(date +%s) - start)) s"
fi

[ $fails -eq 0 ] && echo PASS
[ $fails -eq 0 ]
