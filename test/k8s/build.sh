#!/usr/bin/env bash
# Builds the real Kubernetes and containerd that test/k8s runs, once per version, into
# a cache outside the clone, and prints where they are. Everything comes from the Go
# module proxy: the Kubernetes components from k8s.io/kubernetes (its staging modules
# replaced by their released versions), containerd 2 from its own module.
#
#   test/k8s/build.sh          # builds what is missing, prints the bin folder
#
# The versions, and why these: docs/kubernetes.md ("The test cluster").
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
CACHE=${GPULET_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-k8s}
DIR=$CACHE/k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION
BIN=$DIR/bin
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
export GOFLAGS="-buildvcs=false -mod=mod"
export CGO_ENABLED=0

progress() { echo "test/k8s: $*" >&2; }

have_all() {
	for c in "${COMPONENTS[@]}" containerd containerd-shim-runc-v2 ctr; do
		[ -x "$BIN/$c" ] || return 1
	done
}

if have_all; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$DIR/mod" "$BIN"
# One build at a time per version: a second caller waits for the first.
exec 9>"$DIR/.lock"
if ! flock -n 9; then
	progress "another build of Kubernetes $K8S_VERSION is under way: waiting for it"
	flock 9
fi
if have_all; then
	echo "$BIN"
	exit 0
fi

staging=v0.${K8S_VERSION#v1.}
cd "$DIR/mod"
if [ ! -f go.mod ]; then
	progress "fetching k8s.io/kubernetes $K8S_VERSION from the module proxy"
	gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
	{
		echo "module gpulet-test-k8s"
		echo
		echo "go $(sed -n 's/^go //p' "$gomod")"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		# every staging module that k8s.io/kubernetes requires at v0.0.0 -> its release
		grep -E '^\s+k8s.io/[a-z0-9-]+ v0\.0\.0$' "$gomod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
		echo ")"
	} >go.mod.new
	echo 'package main
func main() {}' >main.go
	mv go.mod.new go.mod
fi

major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	# a fixed build date, so that a rebuild with a warm build cache is a cache hit
	ldflags="$ldflags -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for c in "${COMPONENTS[@]}"; do
	[ -x "$BIN/$c" ] && continue
	progress "building $c $K8S_VERSION (the first build on a machine takes 10-35 minutes in all on 2 CPUs; later runs reuse $BIN)"
	start=$SECONDS
	nice go build -trimpath -ldflags "$ldflags" -o "$BIN/$c.new" "k8s.io/kubernetes/cmd/$c"
	mv "$BIN/$c.new" "$BIN/$c"
	progress "built $c in $((SECONDS - start)) s"
done

if [ ! -x "$BIN/containerd" ] || [ ! -x "$BIN/containerd-shim-runc-v2" ] || [ ! -x "$BIN/ctr" ]; then
	progress "building containerd $CONTAINERD_VERSION"
	start=$SECONDS
	GOBIN=$DIR/containerd.new nice go install -trimpath \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
	mv "$DIR"/containerd.new/* "$BIN"/
	rmdir "$DIR/containerd.new"
	progress "built containerd in $((SECONDS - start)) s"
fi
echo "$BIN"
