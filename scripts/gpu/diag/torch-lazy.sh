#!/usr/bin/env bash
# Diagnostic: torch-lazy.py raw, raw with CUDA_MODULE_LOADING=EAGER, and under gpucap.
D=$(cd "$(dirname "$0")" && pwd); R=$(cd "$D/../../.." && pwd)
echo "== raw (lazy loading, the default)"; python3 "$D/torch-lazy.py" 2>&1 | grep -v Warning
echo "== raw, CUDA_MODULE_LOADING=EAGER"; CUDA_MODULE_LOADING=EAGER python3 "$D/torch-lazy.py" 2>&1 | grep -v Warning
echo "== gpucap run --limit 8Gi"; "$R/target/release/gpucap" run --limit 8Gi -- python3 "$D/torch-lazy.py" 2>&1 | grep -v Warning
