#!/usr/bin/env bash
# Installs what the test suite needs and is missing: the real MPS control daemon
# (Debian's nvidia-cuda-mps, component non-free) and fuse3. Only root can install;
# anyone else gets a note and the tests that need a missing piece skip, saying why.
set -euo pipefail

need=()
command -v nvidia-cuda-mps-control >/dev/null 2>&1 || need+=(nvidia-cuda-mps)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-test-deps: not root, cannot install: ${need[*]} (tests needing them will skip)" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-test-deps: no apt-get, cannot install: ${need[*]} (tests needing them will skip)" >&2
	exit 0
fi

# nvidia-cuda-mps lives in Debian's non-free component; add it to the sources that
# already name the Debian archive, leaving other entries alone.
enable_non_free() {
	local f
	for f in /etc/apt/sources.list.d/debian.sources; do
		[ -f "$f" ] || continue
		if grep -q '^Components:' "$f" && ! grep -q '^Components:.*non-free\b' "$f"; then
			sed -i -E '/^Components:/{/non-free([^-]|$)/!s/$/ non-free/}' "$f"
		fi
	done
	if [ -f /etc/apt/sources.list ]; then
		sed -i -E '/^deb .*debian/{/ non-free( |$)/!s/$/ non-free/}' /etc/apt/sources.list
	fi
}

case " ${need[*]} " in *" nvidia-cuda-mps "*) enable_non_free ;; esac
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "install-test-deps: installed ${need[*]}"
