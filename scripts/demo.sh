#!/usr/bin/env bash
# The main job on the embedded default model (SmolLM2-135M-Instruct): check the example teams,
# ask the model a question, measure the untrained policy's exact Kuhn exploitability, train
# Kuhn poker self-play for a short budget, measure again, then rate the untrained model, the
# run's checkpoints, the random bot and the Nash bot in a tournament and write the report.
#   MARL_DEMO_MINUTES  training budget in minutes (default 15)
#   MARL_DEMO_GAMES    tournament games per pairing, both seats (default 200)
#   MARL_DEMO_OUT      run folder (default runs/demo-<date>-<time>: a new one each time)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
MINUTES=${MARL_DEMO_MINUTES:-15}
GAMES=${MARL_DEMO_GAMES:-200}
OUT=${MARL_DEMO_OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
start=$(date +%s)

$BIN/marl validate configs/*.yaml
$BIN/marl chat --model smollm2-135m-instruct "What is 2+3? Answer with a number."
mkdir -p "$OUT"
$BIN/marl eval exploitability configs/kuhn_selfplay.yaml --game kuhn_poker \
    --out "$OUT/before.json"
$BIN/marl train configs/kuhn_selfplay.yaml --out "$OUT" --max-minutes "$MINUTES"
$BIN/marl eval exploitability "$OUT" --game kuhn_poker --out "$OUT/after.json"
$BIN/marl plot "$OUT"
$BIN/python -m scripts.main_report tournament "$OUT" --games "$GAMES"
$BIN/marl tournament "$OUT/tournament.yaml" --out "$OUT/tournament"
$BIN/python -m scripts.main_report summary "$OUT"
echo "main job done in $(( $(date +%s) - start )) s; report: $OUT/REPORT.md," \
     "$OUT/tournament/report.html, curves: $OUT/curves.png"
