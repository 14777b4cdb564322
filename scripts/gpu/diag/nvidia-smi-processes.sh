#!/usr/bin/env bash
# Diagnostic for pool-pidns: what nvidia-smi --query-compute-apps calls in NVML.
set -u
D=$(cd "$(dirname "$0")" && pwd); R=$(cd "$D/../../.." && pwd); O=${1:-/tmp/diag}; mkdir -p "$O"
CC=$(command -v gcc || echo /opt/gcc/bin/gcc)
$CC -shared -fPIC -O1 -o "$O/interpose.so" "$D/nvml_interpose.c" -ldl || exit 1
SMI=$(command -v nvidia-smi); echo "smi=$SMI"; nvidia-smi --version | head -3; ldd "$SMI" | head
Q=(--query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
cat > "$O/inner.sh" <<IN
python3 -c 'import torch,time; x=torch.empty(16<<20,dtype=torch.uint8,device="cuda"); x.fill_(1); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(40)' > $O/h.out 2>&1 &
for i in \$(seq 150); do grep -q ready $O/h.out && break; sleep 0.2; done; cat $O/h.out
echo "== raw in ns"; nvidia-smi ${Q[*]}
echo "== interposed in ns"; LD_PRELOAD=$O/interpose.so nvidia-smi ${Q[*]}
echo "== bindings in ns"; LD_DEBUG=bindings nvidia-smi ${Q[*]} 2>&1 | grep -o 'symbol .nvml[A-Za-z_0-9]*' | sort | uniq -c | head -60
echo "== gpucap + interposed in ns"; LD_PRELOAD=$O/interpose.so $R/target/release/gpucap run --limit 8Gi --pool diagpool -- nvidia-smi ${Q[*]}
echo "== gpucap bindings in ns"; LD_DEBUG=bindings $R/target/release/gpucap run --limit 8Gi --pool diagpool -- nvidia-smi ${Q[*]} 2>&1 | grep 'symbol .nvml.*Proc' | sed 's/.*binding file //' | sort | uniq -c | head
kill %1
IN
timeout 100 unshare -pf --mount-proc bash "$O/inner.sh" 2>&1
