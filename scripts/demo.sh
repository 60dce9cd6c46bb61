#!/usr/bin/env bash
# The main job on the embedded default model (SmolLM2-135M-Instruct): check the example teams,
# ask the model a question, measure the untrained policy's exact Kuhn exploitability, train
# Kuhn poker self-play with the converging recipe (configs/kuhn_target.yaml: MMD's policy
# targets, fp32) for 40 steps (~25 minutes on a 2-core CPU with AMX, ~35 on one with AVX2
# only), measure the last iterate again, then rate the untrained model, the run's checkpoints,
# the random bot and the Nash bot in a tournament on duplicate deals and write the report.
#   MARL_DEMO_STEPS    training steps (default 40)
#   MARL_DEMO_GAMES    tournament games per pairing, both seats (default 2000: ~4 minutes)
#   MARL_DEMO_OUT      run folder (default runs/demo-<date>-<time>: a new one each time)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
STEPS=${MARL_DEMO_STEPS:-40}
GAMES=${MARL_DEMO_GAMES:-2000}
OUT=${MARL_DEMO_OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
start=$(date +%s)

$BIN/marl validate configs/*.yaml
$BIN/marl chat --model smollm2-135m-instruct "What is 2+3? Answer with a number."
mkdir -p "$OUT"
$BIN/marl eval exploitability configs/kuhn_target.yaml --game kuhn_poker \
    --out "$OUT/before.json"
$BIN/marl train configs/kuhn_target.yaml --out "$OUT" --steps "$STEPS"
$BIN/marl eval exploitability "$OUT" --game kuhn_poker --out "$OUT/after.json"
$BIN/marl plot "$OUT"
$BIN/python -m scripts.main_report tournament "$OUT" --games "$GAMES"
$BIN/marl tournament "$OUT/tournament.yaml" --out "$OUT/tournament"
$BIN/python -m scripts.main_report summary "$OUT"
echo "main job done in $(( $(date +%s) - start )) s; report: $OUT/REPORT.md," \
     "$OUT/tournament/report.html, curves: $OUT/curves.png"
