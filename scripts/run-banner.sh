#!/usr/bin/env bash
# Prints, before `make run` starts gpuletd, where it will listen and how to query it.
flags=$1
sock=/run/gpulet/gpulet.sock
set -- $flags
while [ $# -gt 0 ]; do
	case $1 in --socket) sock=$2; shift ;; esac
	shift
done
cat <<TXT
gpuletd starts in the foreground (Ctrl-C stops it). In another terminal:
  export GPULET_SOCKET=$sock
  bin/gpulet status
  bin/gpurun --units 1 -- sh -c 'echo \$CUDA_VISIBLE_DEVICES'
  curl --unix-socket $sock http://gpulet/v1/snapshot
TXT
