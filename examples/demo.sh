#!/usr/bin/env bash
# The gate on the bundled example, as CI would run it on three pull requests:
#   pr/fused-exp2          rewrites the attention loop and drops the max subtraction
#                          (invisible to a kv_len=1 probe): the gate must FAIL, naming the line;
#   pr/wider-tiles         only widens the attention tiles: the gate must PASS;
#   pr/fused-step-early-store  stores the fused decode step's new key before rotating it (at position 0
#                          the rotation is the identity, so a pos-0 probe passes): the gate must FAIL
#                          with kv-unrotated, dynamically (the 64-step loop, at step 0) and structurally,
#                          naming the store's line;
#   pr/exp2-softmax-step   (GPU, or KERNALIN_DEMO_ALL=1) touches the shared helper module,
#                          so three kernels and the decode pipeline are gated: every verification
#                          must pass; the gate's exit follows the measured speed (on an H200 the
#                          paged kernel measured 0.9% slower, which fails a gate on `slower`). Its
#                          report has the decode throughput of a Llama-3.1-8B step with the changed
#                          kernels in their places (.kernalin.yml `model:`): tokens/s and $/Mtok,
#                          base and head, per serving point on a GPU; "not measured" on the CPU.
# Each gate prints its seconds and the demo its total; the benchmark budgets are in the example's .kernalin.yml.
# Usage: examples/demo.sh [OUT_DIR [PR...]]   (device: cuda when visible, else the CPU interpreter;
#        set KERNALIN_DEVICE=cpu|cuda to choose; PR names, e.g. exp2-softmax-step, gate only those)
# OUT_DIR (default kernalin-demo/, git-ignored) gets one report folder per pull request and the example
# repository itself (OUT_DIR/repo, made anew on every run), kept so that the reproduce commands printed in
# the reports can be run there; nothing else is written.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-kernalin-demo}" && cd "${1:-kernalin-demo}" && pwd)
py=$(command -v python || command -v python3)
device=${KERNALIN_DEVICE:-$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
repo="$out/repo"
rm -rf "$repo"
cp -r "$here/decode-kernels" "$repo"
rm -rf "$repo/prs"
cd "$repo"
git init -q -b main
git add -A
git -c user.name=demo -c user.email=demo@example.invalid commit -qm "base: five decode kernels"

prs=("fused-exp2:1" "wider-tiles:0" "fused-step-early-store:1")
if [ "$device" = cuda ] || [ -n "${KERNALIN_DEMO_ALL:-}" ]; then prs+=("exp2-softmax-step:verified"); fi
if [ $# -gt 1 ]; then  # only the pull requests named
  all=("${prs[@]}" "exp2-softmax-step:verified"); prs=()
  for name in "${@:2}"; do
    found=""
    for item in "${all[@]}"; do if [ "${item%%:*}" = "$name" ]; then found=$item; fi; done
    if [ -z "$found" ]; then echo "demo.sh: no pull request $name (known: ${all[*]%%:*})" >&2; exit 2; fi
    prs+=("$found")
  done
fi
status=0
demo_start=$(date +%s)
for item in "${prs[@]}"; do
  pr=${item%%:*}; want=${item##*:}
  git checkout -q -b "pr/$pr" main
  git apply "$here/decode-kernels/prs/$pr.patch"
  git -c user.name=demo -c user.email=demo@example.invalid commit -qam "$pr"
  echo "== pr/$pr (gate on $device)"
  start=$(date +%s)
  set +e
  kernalin-ci run --base main --head "pr/$pr" --out "$out/$pr" --device "$device"
  rc=$?
  set -e
  echo "== pr/$pr: exit $rc (expected $want) in $(( $(date +%s) - start )) s; report: $out/$pr/report.md"
  head -n 1 "$out/$pr/report.md" || true
  if [ "$want" = verified ]; then  # no finding anywhere; the benchmark verdicts are what they measure
    "$py" - "$out/$pr/report.json" <<'PY' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
units = r["kernels"] + r["pipelines"]
checked = [u for u in units if u.get("verification") or u.get("error")]
bad = [u["name"] for u in checked if u.get("error") or u["verification"]["verdict"] != "pass"]
print(f"   verification: {len(checked)} checked,", "all pass" if not bad else "FAILED: " + ", ".join(bad))
if r.get("model"):
    from kernalin_ci.report.tokens import text_lines
    from kernalin_ci.throughput.bench import ModelResult

    print("\n".join("   " + line for line in text_lines(ModelResult.from_json(r["model"]))))
sys.exit(1 if bad or not checked else 0)
PY
  elif [ "$rc" != "$want" ]; then status=1; fi
done
echo "== ${#prs[@]} gates in $(( $(date +%s) - demo_start )) s; the example repository (for the reproduce commands): $repo"
exit $status
