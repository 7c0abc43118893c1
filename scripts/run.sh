#!/usr/bin/env bash
# make run and make clean: where gpuletd keeps its files when a newcomer starts it.
#
#   run.sh run BIN LOCAL RUN_DIR [gpuletd flags...]   say where things are, run gpuletd
#   run.sh clean LOCAL                                 remove the run dir run.sh chose
#
# As root with RUN_DIR empty, gpuletd runs with its own defaults (/run/gpulet,
# /var/lib/gpulet), like the systemd service. Otherwise it is a private instance:
# socket, run dir and FUSE view in RUN_DIR, state in LOCAL/state (LOCAL is the
# clone's .run). An empty RUN_DIR is $XDG_RUNTIME_DIR/gpulet where that is usable,
# else /tmp/gpulet-UID. Neither lives in the clone, whose path can be of any
# length: the MPS control daemon listens only in pipe folders of at most 87 bytes,
# which gpuletd makes at <run dir>/mps/GPU-<36-character UUID>/<k>/pipe.
set -euo pipefail

uid=$(id -u)
# 87 bytes for the pipe folder, less "/mps/GPU-" (9), the UUID (36), "/k/pipe" (7).
max_run_dir=35
# A Unix socket path holds at most 107 bytes (sun_path's 108, less the NUL).
max_socket=107

fail() {
	echo "make run: $*" >&2
	exit 1
}

# mode_of prints "UID MODE TYPE" of a path, never following a symlink (GNU stat
# reports on the link itself unless told -L).
mode_of() { stat -c '%u %a %F' -- "$1"; }

# usable_runtime: $XDG_RUNTIME_DIR as the XDG spec wants it (a folder of ours,
# mode 0700), and short enough that <it>/gpulet fits the MPS pipe folders.
usable_runtime() {
	local d=${XDG_RUNTIME_DIR:-}
	case $d in /*) ;; *) return 1 ;; esac
	[ $((${#d} + 7)) -le $max_run_dir ] || return 1
	[ "$(mode_of "$d" 2>/dev/null)" = "$uid 700 directory" ] && [ -w "$d" ]
}

# own_dir makes sure $1 is a folder of ours, mode 0700, creating it if missing.
# /tmp is everyone's: another user may have made the name first, as a folder, a
# file or a symlink to somewhere of ours. mkdir never follows a symlink, and the
# one stat after it sees what is there now; once it is our folder, /tmp's sticky
# bit keeps others from renaming or removing it.
own_dir() {
	local d=$1 owner mode type
	mkdir -m 0700 -- "$d" 2>/dev/null || true
	read -r owner mode type < <(mode_of "$d" 2>/dev/null || echo "- - missing")
	if [ "$type" != directory ] || [ "$owner" != "$uid" ]; then
		fail "$d is not a folder of yours (${type}, owner uid ${owner}): someone else made it first. Remove it if you can, or choose another: make run RUN_DIR=/a/short/folder/of/yours"
	fi
	[ "$mode" = 700 ] || chmod 0700 -- "$d"
}

private_dir() {
	if usable_runtime; then
		echo "$XDG_RUNTIME_DIR/gpulet"
		return
	fi
	[ -k /tmp ] || fail "/tmp has no sticky bit, so a folder of yours there is not safe: make run RUN_DIR=/a/short/folder/of/yours"
	echo "/tmp/gpulet-$uid"
}

# lock_holder prints the pid that holds gpuletd's lock in run dir $1, as
# /proc/locks names it by the lock file's device and inode; nothing if none.
lock_holder() {
	local lock=$1/gpuletd.lock dev ino
	[ -e "$lock" ] || return 0
	read -r dev ino < <(stat -c '%D %i' -- "$lock" 2>/dev/null) || return 0
	# /proc/locks writes MAJOR:MINOR:INODE, the numbers in hex, hex, decimal.
	local id
	id=$(printf '%02x:%02x:%s' $((0x$dev >> 8 & 0xfff)) $((0x$dev & 0xff)) "$ino")
	awk -v id="$id" '$2 == "FLOCK" && $6 == id { print $5; exit }' /proc/locks 2>/dev/null || true
}

# other_gpus says why a private instance should not drive this host's GPUs,
# or nothing: the host has NVIDIA devices (under GPULET_DEV_DIR, default
# /dev), or the system's gpuletd runs (GPULET_SYSTEM_RUN_DIR, default
# /run/gpulet, where the admin's keeps its lock).
other_gpus() {
	local why=() pid
	if compgen -G "${GPULET_DEV_DIR:-/dev}/nvidia[0-9]*" >/dev/null; then
		why+=("this host has NVIDIA GPUs")
	fi
	# The system's gpuletd (the admin's), which holds the lock in its run dir.
	local sys=${GPULET_SYSTEM_RUN_DIR:-/run/gpulet}
	pid=$(lock_holder "$sys")
	[ -z "$pid" ] || why+=("gpuletd pid $pid runs here with run dir $sys")
	local out="" w
	for w in "${why[@]}"; do out+="${out:+; }$w"; done
	printf '%s' "$out"
}

# last_flag NAME DEFAULT FLAGS...: the value the last --NAME in FLAGS gives
# (pflag keeps the last one), else DEFAULT.
last_flag() {
	local name=$1 v=$2
	shift 2
	while [ $# -gt 0 ]; do
		case $1 in
		--"$name") v=${2-}; shift ;;
		--"$name"=*) v=${1#*=} ;;
		esac
		shift
	done
	printf '%s' "$v"
}

run() {
	local bin=$1 local_dir=$2 run_dir=$3
	shift 3
	local flags=()
	if [ "$uid" -ne 0 ] || [ -n "$run_dir" ]; then
		if [ -z "$run_dir" ]; then
			run_dir=$(private_dir)
			own_dir "$run_dir"
			# make clean removes what make run chose, and only that.
			mkdir -p -- "$local_dir"
			printf '%s\n' "$run_dir" >"$local_dir/run-dir"
		fi
		case $run_dir in /*) ;; *) run_dir=$PWD/$run_dir ;; esac
		# An empty --socket-group leaves the socket to its owner alone.
		flags=(--socket-group= --socket "$run_dir/gpulet.sock" --run-dir "$run_dir" --state-dir "$local_dir/state")
		# A private instance beside real GPUs or the admin's gpuletd would
		# drive those GPUs with MPS daemons of its own: it simulates unless
		# RUN_FLAGS names a backend (the last flag wins).
		private_why=$(other_gpus)
		[ -z "$private_why" ] || flags+=(--backend sim --mps off)
	fi
	flags+=("$@")
	local sock rd state view
	sock=$(last_flag socket /run/gpulet/gpulet.sock "${flags[@]}")
	rd=$(last_flag run-dir /run/gpulet "${flags[@]}")
	state=$(last_flag state-dir /var/lib/gpulet "${flags[@]}")
	view=$(last_flag mount "$rd/view" "${flags[@]}")
	[ ${#sock} -le $max_socket ] || fail "the socket $sock is ${#sock} bytes, and a Unix socket path holds at most $max_socket: choose a shorter run dir: make run RUN_DIR=/a/short/folder"
	local holder
	holder=$(lock_holder "$rd")
	[ -z "$holder" ] || fail "gpuletd (pid $holder) already runs with run dir $rd: stop it first (kill $holder), or start another with make run RUN_DIR=/another/short/folder"
	local fit=""
	[ ${#rd} -le $max_run_dir ] || fit=" (over $max_run_dir bytes, too long for MPS: --mps auto runs without it)"
	local backend
	backend=$(last_flag backend auto "${flags[@]}")
	if [ -n "${private_why:-}" ] && [ "$backend" = sim ]; then
		backend="sim, MPS off: $private_why (RUN_FLAGS='--backend nvml --mps auto' drives the GPUs instead)"
	fi
	cat <<TXT
gpuletd starts in the foreground (Ctrl-C stops it).
  backend    $backend
  socket     $sock
  run dir    $rd$fit
             pipe-file ledger, lease journal, MPS pipe and log folders
  state dir  $state
  FUSE view  ${view:-none}
In another terminal:
  export GPULET_SOCKET=$(printf %q "$sock")
  export GPULET_RUN_DIR=$(printf %q "$rd")    # for gpurun --offline
  $bin/gpulet status
  $bin/gpurun --units 1 -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'
  curl --unix-socket \$GPULET_SOCKET http://gpulet/v1/snapshot
TXT
	exec "$bin/gpuletd" "${flags[@]}"
}

# state_user prints the pid of a gpuletd whose --state-dir is $1, or nothing:
# make clean removes the state dir with the clone's .run, whatever run dir
# that gpuletd has (one chosen from another $XDG_RUNTIME_DIR, say).
state_user() {
	local want=$1 p comm
	for p in /proc/[0-9]*; do
		read -r comm <"$p/comm" 2>/dev/null || continue
		[ "$comm" = gpuletd ] || continue
		if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | awk -v d="$want" '
			prev == "--state-dir" && $0 == d { found = 1 }
			$0 == "--state-dir=" d { found = 1 }
			{ prev = $0 } END { exit !found }'; then
			printf '%s' "${p#/proc/}"
			return
		fi
	done
}

# mps_daemons prints the pids of the MPS control daemons ("...-control -d")
# whose pipe folder is under $1, space-separated; nothing if none.
mps_daemons() {
	local under=$1/ p i e daemon args env pids=()
	for p in /proc/[0-9]*; do
		# mapfile reads the NUL-separated lists without a process per pid.
		mapfile -d '' -t args <"$p/cmdline" 2>/dev/null || continue
		daemon=
		for ((i = 0; i + 1 < ${#args[@]}; i++)); do
			[[ ${args[i]} == *nvidia-cuda-mps-control && ${args[i + 1]} == -d ]] && daemon=1
		done
		[ -n "$daemon" ] || continue
		mapfile -d '' -t env <"$p/environ" 2>/dev/null || continue
		for e in "${env[@]}"; do
			[[ $e == "CUDA_MPS_PIPE_DIRECTORY=$under"* ]] && pids+=("${p#/proc/}") && break
		done
	done
	printf '%s' "${pids[*]}"
}

# clean removes the run dir that run chose, if it is still a folder of ours that no
# gpuletd uses; its MPS control daemons are told to quit, its view unmounted.
# It refuses while a gpuletd uses the clone's state dir, and leaves the run dir
# while a control daemon told to quit still serves clients.
clean() {
	local rec=$1/run-dir d owner mode type pid
	pid=$(state_user "$1/state")
	if [ -n "$pid" ]; then
		echo "make clean: gpuletd (pid $pid) still runs with state dir $1/state: stop it first" >&2
		exit 1
	fi
	[ -f "$rec" ] || return 0
	d=$(cat -- "$rec")
	# Only the two folders run chooses, spelled exactly: a pattern would also
	# match /run/gpulet or /var/lib/gpulet.
	if [ "$d" != "/tmp/gpulet-$uid" ] && { [ -z "${XDG_RUNTIME_DIR:-}" ] || [ "$d" != "$XDG_RUNTIME_DIR/gpulet" ]; }; then
		echo "make clean: $rec names $d, which is not a run dir make run chooses for you here: left alone" >&2
		return 0
	fi
	read -r owner mode type < <(mode_of "$d" 2>/dev/null || echo "- - missing")
	[ "$type" != missing ] || return 0
	if [ "$type" != directory ] || [ "$owner" != "$uid" ]; then
		echo "make clean: $d is not a folder of yours: left alone" >&2
		return 0
	fi
	if [ -e "$d/gpuletd.lock" ] && command -v flock >/dev/null && ! flock -n "$d/gpuletd.lock" true; then
		echo "make clean: gpuletd still runs with run dir $d: stop it first" >&2
		exit 1
	fi
	if command -v nvidia-cuda-mps-control >/dev/null; then
		local p
		for p in "$d"/mps/*/*/pipe; do
			[ -d "$p" ] || continue
			echo quit | CUDA_MPS_PIPE_DIRECTORY=$p timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1 || true
		done
	fi
	# A daemon told to quit goes once its clients end: one that gpuletd left
	# running for the clients of a job (Ctrl-C with a lease held) stays while
	# they run, and its folders stay with it.
	local left tries=50
	while left=$(mps_daemons "$d") && [ -n "$left" ] && [ $((tries -= 1)) -gt 0 ]; do
		sleep 0.1
	done
	if [ -n "$left" ]; then
		echo "make clean: the MPS control daemon(s) $left of $d still serve clients, told to quit once they end: $d is left; make clean again after" >&2
		exit 1
	fi
	if mountpoint -q "$d/view" 2>/dev/null; then
		fusermount3 -u -z "$d/view" 2>/dev/null || umount -l "$d/view" 2>/dev/null || true
	fi
	rm -rf -- "$d"
	rm -f -- "$rec"
	echo "removed $d"
}

cmd=${1-}
shift || true
case $cmd in
run) run "$@" ;;
clean) clean "$@" ;;
*) fail "usage: run.sh run BIN LOCAL RUN_DIR [flags...] | run.sh clean LOCAL" ;;
esac
