#!/usr/bin/env bash
# Installs what the test suite needs and is missing: the real MPS control daemon
# (Debian's nvidia-cuda-mps, component non-free), fuse3, Prometheus and promtool
# (Debian's prometheus), a one-node Slurm (Debian's slurmctld, slurmd, munge and
# slurm-client), what the one-node Kubernetes of test/k8s runs on besides the
# binaries it builds itself (Debian's etcd-server, runc and containernetworking-plugins)
# and staticcheck. Only root can
# install system packages; anyone else gets a note and the tests that need a missing
# piece skip, saying why.
set -euo pipefail

need=()
command -v nvidia-cuda-mps-control >/dev/null 2>&1 || need+=(nvidia-cuda-mps)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
# promtool lints gpuletd's /metrics, and a real Prometheus server scrapes it.
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
# TestSlurm starts munged, slurmctld and slurmd itself and runs jobs with srun and sbatch.
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v srun >/dev/null 2>&1 || need+=(slurm-client)
# test/k8s runs etcd, and containerd's CRI runs pods with runc and reports the
# node's network ready through the loopback CNI plugin.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "install-test-deps: cannot install (not root or no apt-get): ${need[*]} (tests needing them will skip)" >&2
	else
		# nvidia-cuda-mps lives in Debian's non-free component. Rather than edit the
		# system's sources, add a sources file of our own that names non-free for the
		# Debian suites already configured, install, and remove it again.
		extra=/etc/apt/sources.list.d/gpulet-test-non-free.sources
		cleanup() { rm -f "$extra"; }
		trap cleanup EXIT
		case " ${need[*]} " in *" nvidia-cuda-mps "*)
			awk '
				/^URIs:/ { uris = $0 } /^Suites:/ { suites = $0 } /^Signed-By:/ { signed = $0 }
				/^$/ { flush() } END { flush() }
				function flush() {
					if (uris ~ /debian/ && uris !~ /security/) {
						print "Types: deb"; print uris; print suites; print "Components: non-free"
						if (signed != "") print signed
						print ""
					}
					uris = ""; suites = ""; signed = ""
				}' /etc/apt/sources.list.d/*.sources > "$extra" 2>/dev/null || true
			if [ -f /etc/apt/sources.list ]; then
				awk '/^deb .*debian/ && !/security/ { print $1, $2, $3, "non-free" }' /etc/apt/sources.list > /tmp/gpulet-test-non-free.list
				if [ -s /tmp/gpulet-test-non-free.list ]; then
					mv /tmp/gpulet-test-non-free.list /etc/apt/sources.list.d/gpulet-test-non-free.list
					cleanup() { rm -f "$extra" /etc/apt/sources.list.d/gpulet-test-non-free.list; }
				fi
				rm -f /tmp/gpulet-test-non-free.list
			fi
			;;
		esac
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
		cleanup
		trap - EXIT
		echo "install-test-deps: installed ${need[*]}"
	fi
fi

# staticcheck is a Go tool: installed into GOBIN from the module proxy, pinned.
if ! command -v staticcheck >/dev/null 2>&1 && [ ! -x "$(go env GOPATH)/bin/staticcheck" ]; then
	go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	echo "install-test-deps: installed staticcheck"
fi

# test/k8s runs a real Kubernetes, built from the module proxy once per version into
# a cache outside the clone. Built here, before go test, whose -timeout the first
# build on a machine (10-35 minutes) would pass; later runs find it at once. The
# cluster needs root: anyone else's tests skip it, so nothing is built for them.
if [ "$(id -u)" -eq 0 ]; then
	"$(dirname "$0")/../test/k8s/build.sh" >/dev/null
fi
