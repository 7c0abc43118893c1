#!/usr/bin/env bash
# gpulet on a real NVIDIA GPU: builds its own CUDA job (probe.cu), starts
# gpuletd on NVML with MPS, and checks what the simulator stands in for. It
# prints one table (also written to $OUT/table.txt with the logs beside it) and
# exits 1 if a check failed. Run it as root on a host with an NVIDIA GPU, nvcc,
# nvidia-cuda-mps-control and python3, from a clone where `make build` ran:
#
#     sudo test/gpu/run.sh            # OUT=/some/dir keeps the logs there
#
# It creates three users (gpuchk1..3) and a group (gpuchk), and removes them at
# the end. GPU 0 is the one checked. docs/hardware.md records the runs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${GPULET_BIN:-$root/bin}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/nvidia/bin:/usr/local/cuda/bin

die() { echo "test/gpu: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run it as root: it starts gpuletd with MPS and runs jobs as three users"
for t in nvidia-smi nvcc nvidia-cuda-mps-control python3 useradd timeout; do
	command -v $t >/dev/null || die "$t is not installed"
done
if [ ! -x "$bin/gpuletd" ]; then
	command -v go >/dev/null || die "no gpulet binaries in $bin and no Go to build them: run make build first"
	make -C "$root" build >/dev/null || die "make build failed"
fi
# A short folder: the MPS control daemon takes pipe folders of at most 87 bytes.
w=$(mktemp -d /tmp/gpuXXXX)
chmod 755 "$w"
probe=$w/probe
nvcc -O2 -o "$probe" "$here/probe.cu" > "$OUT/nvcc.log" 2>&1 || { cat "$OUT/nvcc.log"; die "nvcc failed"; }
chmod 755 "$probe"

group=gpuchk users=(gpuchk1 gpuchk2 gpuchk3)
groupadd -f $group
for u in "${users[@]}"; do useradd -M -N -g $group -s /bin/sh $u 2>/dev/null; done
gp=0
cleanup() {
	[ "$gp" != 0 ] && kill -TERM $gp 2>/dev/null && wait $gp 2>/dev/null
	for u in "${users[@]}"; do userdel $u 2>/dev/null; done
	groupdel $group 2>/dev/null
	echo quit | CUDA_MPS_PIPE_DIRECTORY=$w/plain/p nvidia-cuda-mps-control >/dev/null 2>&1
	rm -rf "$w"
}
trap cleanup EXIT

export GPULET_SOCKET=$w/s
rows=()
failed=0
# check NAME WANT GOT OK(0|1)
check() {
	local ok=PASS
	[ "$4" = 0 ] && { ok=FAIL; failed=1; }
	rows+=("$1|$2|$3|$ok")
	echo "   $1: $3 ($ok)"
}
ms() { date +%s%3N; }
# as USER CMD...: runs CMD as USER in the group, with setpriv or, where the
# image lacks it, Python's own setuid.
as() {
	local u=$1; shift
	if command -v setpriv >/dev/null; then
		setpriv --reuid=$u --regid=$group --clear-groups env GPULET_SOCKET=$w/s "$@"
	else
		GPULET_SOCKET=$w/s python3 -c 'import os,sys,pwd,grp
os.setgroups([]); os.setgid(grp.getgrnam(sys.argv[2]).gr_gid); os.setuid(pwd.getpwnam(sys.argv[1]).pw_uid)
os.execvp(sys.argv[3], sys.argv[3:])' $u $group "$@"
	fi
}
snap() { "$bin/gpulet" status --json; }
# js EXPR: evaluates EXPR over the JSON on stdin (d); prints it.
js() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)" 2>/dev/null; }
# field N KEY: KEY of the Nth JSON line of the probe output on stdin.
field() { python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.stdin if l.startswith('{')]
print(rows[$1].get('$2','') if len(rows)>$1 else '')" 2>/dev/null; }

start() { # start K EXTRA...
	local k=$1; shift
	[ "$gp" != 0 ] && { kill -TERM $gp; wait $gp; }
	"$bin/gpuletd" --backend nvml --mps on --instances-per-gpu $k --socket $w/s --run-dir $w/r$k \
		--state-dir $w/st --mount "" --socket-group $group --sample-interval 200ms "$@" > "$OUT/gpuletd-k$k.log" 2>&1 &
	gp=$!
	for _ in $(seq 100); do "$bin/gpulet" status >/dev/null 2>&1 && break; sleep 0.1; done
	kill -0 $gp 2>/dev/null || { tail -20 "$OUT/gpuletd-k$k.log"; gp=0; die "gpuletd with K=$k did not start"; }
	chmod 755 $w
}

echo "== GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
smi_name=$(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader)
smi_mem=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits)

# 1. Inventory and K instances.
echo "== 1. Inventory and K instances"
start 2
snap > "$OUT/snapshot-k2.json"
name=$(js 'd["gpus"][0]["name"]' < "$OUT/snapshot-k2.json")
mem=$(js 'd["gpus"][0]["memory_total_mib"]' < "$OUT/snapshot-k2.json")
check "inventory" "$smi_name, $smi_mem MiB" "$name, $mem MiB" $([ "$name" = "$smi_name" ] && [ $((mem - smi_mem)) -le 1 ] && [ $((smi_mem - mem)) -le 1 ] && echo 1 || echo 0)
running=$(js 'sum(1 for i in d["gpus"][0]["instances"] if i["state"]=="running")' < "$OUT/snapshot-k2.json")
check "K=2 MPS instances" "2 running" "$running running" $([ "$running" = 2 ] && echo 1 || echo 0)
src=$(js 'd["gpus"][0]["utilization_source"]' < "$OUT/snapshot-k2.json")
check "utilization source" "gpm_sm (Hopper+) or process_sm" "$src" $([ "$src" = gpm_sm ] || [ "$src" = process_sm ] && echo 1 || echo 0)

# 2. The memory limit and the thread percentage as CUDA sees them.
echo "== 2. The memory limit and the thread percentage as CUDA sees them"
out=$(timeout 90 "$bin/gpurun" --units 4 --memory 4G -- "$probe" 2048 3500 8192 2>&1); echo "$out" > "$OUT/memlimit.txt"
got="$(echo "$out" | field 1 ok) $(echo "$out" | field 2 ok) $(echo "$out" | field 3 ok), free $(echo "$out" | field 0 free_mib) MiB"
check "memory limit 4G" "True True False, free<=4096" "$got" $([[ "$got" == "True True False, free "* ]] && [ "$(echo "$out" | field 0 free_mib)" -le 4096 ] && echo 1 || echo 0)
total_sms=$("$probe" | field 0 sms)
for n in 8 4 2 1; do
	out=$(timeout 90 "$bin/gpurun" --units $n -- "$probe" 2>&1)
	pct=$(echo "$out" | field 0 thread_pct); sms=$(echo "$out" | field 0 sms)
	want=$(( total_sms * ${pct:-0} / 100 ))
	check "thread % ($n units)" "~$want of $total_sms SMs at $pct%" "$sms SMs" $([ -n "$sms" ] && [ $((sms - want)) -le 2 ] && [ $((want - sms)) -le 2 ] && echo 1 || echo 0)
done

# 3. Two users at once on K=2: each kernel as fast as alone.
echo "== 3. Two users at once on K=2: each kernel as fast as alone"
alone=$(as ${users[0]} timeout 90 "$bin/gpurun" --units 8 -- "$probe" spin:1000 | field 1 kernel_ms)
t0=$(ms)
as ${users[0]} timeout 90 "$bin/gpurun" --units 8 -- "$probe" spin:1000 > $w/a.txt 2>&1 & a=$!
as ${users[1]} timeout 90 "$bin/gpurun" --units 8 -- "$probe" spin:1000 > $w/b.txt 2>&1 & b=$!
wait $a $b; wall=$(( $(ms) - t0 ))
ka=$(field 1 kernel_ms < $w/a.txt); kb=$(field 1 kernel_ms < $w/b.txt)
check "two users at once (K=2)" "kernels ~${alone} ms each" "${ka:-none} and ${kb:-none} ms, wall $wall ms" \
	$(python3 -c "print(1 if '$ka' and '$kb' and max(float('$ka'),float('$kb')) < 1.3*float('${alone:-0}' or 1) else 0)")

# 4. kill -9 of a job frees its units. The job is the probe: gpurun execs
# it, so it holds the lease (the shell function around it does not).
echo "== 4. kill -9 of a job frees its units"
free0=$(snap | js 'd["units_free"]')
as ${users[0]} "$bin/gpurun" --units 4 -- "$probe" spin:3000 > /dev/null 2>&1 & job=$!
for _ in $(seq 100); do [ "$(snap | js 'd["units_free"]')" != "$free0" ] && break; sleep 0.05; done
for _ in $(seq 100); do pgrep -f "^$probe spin:3000" > /dev/null && break; sleep 0.05; done
t0=$(ms); pkill -9 -f "^$probe spin:3000"
for _ in $(seq 400); do [ "$(snap | js 'd["units_free"]')" = "$free0" ] && break; sleep 0.005; done
freed=$(( $(ms) - t0 ))
check "kill -9 frees the units" "within 1000 ms" "$freed ms" $([ $freed -lt 1000 ] && echo 1 || echo 0)
wait $job 2>/dev/null

# 5. An offline claim beside another user's job: it must go to the other
# instance and start at once (it waited for the job's end before users.json),
# and it is measured.
echo "== 5. An offline claim beside another user's job"
as ${users[0]} timeout 90 "$bin/gpurun" --units 4 -- "$probe" spin:4000 > /dev/null 2>&1 & busy=$!
for _ in $(seq 100); do [ "$(snap | js 'd["units_free"]')" != "$free0" ] && break; sleep 0.05; done
t0=$(ms)
as ${users[1]} timeout 90 "$bin/gpurun" --offline --run-dir $w/r2 -- "$probe" keep:600 sleep:3000 > $w/off.txt 2>&1 & off=$!
for _ in $(seq 200); do [ -n "$(field 0 pid < $w/off.txt)" ] && break; sleep 0.05; done
started=$(( $(ms) - t0 ))
check "offline claim beside a job" "starts within 3000 ms" "$started ms" $([ $started -lt 3000 ] && echo 1 || echo 0)
sleep 1
cpid=$(field 0 pid < $w/off.txt)
snap > "$OUT/snapshot-claim.json"
claim=$(js '[c for c in d["gpus"][0].get("claims",[]) if c.get("pid")=='"${cpid:-0}"']' < "$OUT/snapshot-claim.json")
nv=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$cpid" '$1==p{print $2}')
cmem=$(echo "$claim" | python3 -c "import sys,ast; c=ast.literal_eval(sys.stdin.read() or '[]'); print(c[0]['usage']['memory_used_mib'] if c and c[0].get('usage') else '')" 2>/dev/null)
check "offline claim measured" "pid $cpid, NVML ${nv:-?} MiB" "${cmem:-none} MiB" $([ -n "$cmem" ] && [ "$cmem" = "$nv" ] && echo 1 || echo 0)
wait $off
pkill -9 -f "$probe spin:4000"; kill $busy 2>/dev/null; wait $busy 2>/dev/null

# 6. Per-lease usage against what NVML lists, and a process beside gpulet.
echo "== 6. Per-lease usage against what NVML lists, and a process beside gpulet"
# --wait: the MPS servers of step 5's users may still list their ended
# clients for a moment, and then serve nobody else yet.
timeout 90 "$bin/gpurun" --wait 30s --units 2 -- "$probe" keep:3000 sleep:3000 > "$OUT/use.txt" 2>&1 & use=$!
for _ in $(seq 200); do [ -n "$(field 0 pid < "$OUT/use.txt")" ] && break; sleep 0.05; done
"$probe" keep:1000 sleep:3000 > $w/outside.txt 2>&1 & outside=$!
sleep 1.5
lpid=$(field 0 pid < "$OUT/use.txt"); opid=$(field 0 pid < $w/outside.txt)
apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits); echo "$apps" > "$OUT/compute-apps.txt"
nv=$(echo "$apps" | awk -F', ' -v p="$lpid" '$1==p{print $2}')
lmem=$("$bin/gpulet" leases --all --json | js '[l["usage"]["memory_used_mib"] for l in d["leases"] if l.get("usage") and '"${lpid:-0}"' in l["usage"]["pids"]][0]')
check "lease usage = NVML" "pid $lpid: ${nv:-?} MiB" "${lmem:-none} MiB" $([ -n "$lmem" ] && [ "$lmem" = "$nv" ] && echo 1 || echo 0)
nvo=$(echo "$apps" | awk -F', ' -v p="$opid" '$1==p{print $2}')
omem=$(snap | js '[p["memory_used_mib"] for p in d["gpus"][0].get("outside_processes",[]) if p["pid"]=='"${opid:-0}"'][0]')
check "process beside gpulet" "pid $opid: ${nvo:-?} MiB" "${omem:-none} MiB" $([ -n "$omem" ] && [ "$omem" = "$nvo" ] && echo 1 || echo 0)
wait $use $outside

# 7. Three users one after another on one instance (K=1): an idle MPS server
echo "== 7. Three users one after another on one instance (K=1): an idle MPS server"
# keeps nobody out.
start 1 --max-utilization 90
rc=""
for u in "${users[@]}"; do
	as $u timeout 90 "$bin/gpurun" --units 4 -- "$probe" spin:100 > $w/seq.txt 2>&1; rc="$rc$? "
	sleep 0.6
done
check "three users in turn (K=1)" "0 0 0" "${rc% }" $([ "${rc% }" = "0 0 0" ] && echo 1 || echo 0)
srv=$(snap | js '[(s.get("uid"),s["clients"]) for s in d["gpus"][0]["instances"][0].get("servers",[])]')
check "idle server listed" "[(uid of ${users[2]}, 0)]" "$srv" $([ "$srv" = "[($(id -u ${users[2]}), 0)]" ] && echo 1 || echo 0)

# 7b. A whole GPU (gpurun --gpus) while the idle MPS server of step 7 is still
# up: the job runs without MPS, on every SM. Step 8 then leases units through
# MPS again.
echo "== 7b. A whole GPU beside an idle MPS server"
out=$(as ${users[0]} timeout 90 "$bin/gpurun" --gpus 1 -- "$probe" 2>&1); wrc=$?
echo "$out" > "$OUT/whole-gpu.txt"
wsms=$(echo "$out" | field 0 sms)
check "whole GPU (--gpus 1)" "rc 0, all $total_sms SMs" "rc $wrc, ${wsms:-no} SMs" $([ $wrc = 0 ] && [ "$wsms" = "$total_sms" ] && echo 1 || echo 0)

# 8. The threshold with a small job: kernel time 100%, SMs well below 90%.
echo "== 8. The threshold with a small job: kernel time 100%, SMs well below 90%"
as ${users[0]} timeout 90 "$bin/gpurun" --units 2 -- "$probe" spin:4000 > /dev/null 2>&1 & small=$!
sleep 2
snap > "$OUT/snapshot-small-job.json"; "$bin/gpulet" status > "$OUT/status-small-job.txt" 2>&1
got=$(js '"kernel %d%%, SM %d%% (%s), eligible %s" % (d["gpus"][0]["kernel_time_pct"], d["gpus"][0]["utilization_pct"], d["gpus"][0]["utilization_source"], d["gpus"][0]["eligible"])' < "$OUT/snapshot-small-job.json")
as ${users[0]} timeout 90 "$bin/gpurun" --units 2 -- "$probe" spin:10 > /dev/null 2>&1; second=$?
check "threshold, one 13% job" "SM < 90%, eligible, 2nd lease ok" "$got; 2nd lease rc $second" $([[ "$got" == *"eligible True" ]] && [ $second = 0 ] && echo 1 || echo 0)
wait $small

# 9. Benchmark: four users at 13% of the SMs each, K=4 against one plain MPS
echo "== 9. Benchmark: four users at 13% of the SMs each, K=4 against one plain MPS"
# control daemon (what NVIDIA's device plugin and Slurm run).
groupusers=("${users[@]}" root)
start 4
t0=$(ms); pids=()
for u in "${groupusers[@]}"; do as $u timeout 90 "$bin/gpurun" --units 2 -- "$probe" spin:1000 > /dev/null 2>&1 & pids+=($!); done
wait "${pids[@]}"; k4=$(( $(ms) - t0 ))
kill -TERM $gp; wait $gp; gp=0
mkdir -p $w/plain/p $w/plain/l; chmod 777 $w/plain/p $w/plain/l
CUDA_MPS_PIPE_DIRECTORY=$w/plain/p CUDA_MPS_LOG_DIRECTORY=$w/plain/l nvidia-cuda-mps-control -d
t0=$(ms); pids=()
for u in "${groupusers[@]}"; do
	as $u env CUDA_MPS_PIPE_DIRECTORY=$w/plain/p CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13 timeout 90 "$probe" spin:1000 > /dev/null 2>&1 & pids+=($!)
done
wait "${pids[@]}"; plain=$(( $(ms) - t0 ))
check "4 users: K=4 vs one MPS daemon" "K=4 faster" "$k4 ms vs $plain ms" $([ $k4 -lt $plain ] && echo 1 || echo 0)

{
	echo "gpulet real-GPU check, $(date -u +%Y-%m-%dT%H:%MZ), $(head -1 "$OUT/gpu.txt")"
	printf '%-32s | %-36s | %-48s | %s\n' CHECK EXPECTED GOT RESULT
	for r in "${rows[@]}"; do IFS='|' read -r a b c d <<< "$r"; printf '%-32s | %-36s | %-48s | %s\n' "$a" "$b" "$c" "$d"; done
} | tee "$OUT/table.txt"
exit $failed
