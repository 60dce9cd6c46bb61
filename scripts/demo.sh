#!/usr/bin/env bash
# The main job on the embedded default model (SmolLM2-135M-Instruct): check the example teams,
# ask the model a question, train Kuhn poker self-play for a short budget, then measure the
# exact exploitability before and after and draw the learning curves.
#   MARL_DEMO_MINUTES  training budget in minutes (default 15)
#   MARL_DEMO_OUT      run folder (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
MINUTES=${MARL_DEMO_MINUTES:-15}
OUT=${MARL_DEMO_OUT:-runs/demo}
start=$(date +%s)

$BIN/marl validate configs/*.yaml
$BIN/marl chat --model smollm2-135m-instruct "What is 2+3? Answer with a number."
$BIN/marl eval exploitability configs/kuhn_selfplay.yaml --game kuhn_poker \
    --out "$OUT.before.json"
$BIN/marl train configs/kuhn_selfplay.yaml --out "$OUT" --max-minutes "$MINUTES"
$BIN/marl eval exploitability "$OUT" --game kuhn_poker --out "$OUT.after.json"
$BIN/marl plot "$OUT"
$BIN/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
before = json.load(open(f"{out}.before.json"))["exploitability"]
after = json.load(open(f"{out}.after.json"))["exploitability"]
verdict = "lower (better)" if after < before else "NOT lower"
print(f"Kuhn exploitability: untrained {before:.4f} -> trained {after:.4f}: {verdict}")
PY
echo "main job done in $(( $(date +%s) - start )) s; curves: $OUT/curves.png"
