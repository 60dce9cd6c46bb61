#!/usr/bin/env bash
# The main job on the embedded default model (SmolLM2-135M-Instruct).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/marl validate configs/*.yaml
$BIN/marl chat --model smollm2-135m-instruct "What is 2+3? Answer with a number."
