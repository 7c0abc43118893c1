package kcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseLdd(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want []string
	}{
		{"glibc binary", "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n",
			[]string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}},
		{"a library not found", "\tlibnvidia-ml.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n", []string{"/lib/libc.so.6"}},
		{"static binary", "\tnot a dynamic executable\n", nil},
		{"path cleaned", "\tlibm.so.6 => /lib/../lib/libm.so.6 (0x1)\n", []string{"/lib/libm.so.6"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseLdd(tt.out); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseLdd = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseLdd(f *testing.F) {
	f.Add("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x1)\n")
	f.Add("=>\n => =>/\n")
	f.Fuzz(func(t *testing.T, out string) {
		for _, p := range parseLdd(out) {
			if !strings.HasPrefix(p, "/") {
				t.Fatalf("parseLdd(%q) gave a relative path %q", out, p)
			}
		}
	})
}

func TestMountsUnder(t *testing.T) {
	mi := `22 1 0:21 / /proc rw - proc proc rw
30 1 0:30 / /var/lib/gpulet-test-k8s/containerd/a rw - overlay overlay rw
31 30 0:31 / /var/lib/gpulet-test-k8s/containerd/a/dev/shm rw - tmpfs shm rw
32 1 0:32 / /var/lib/gpulet-test-k8s-other rw - tmpfs t rw
33 1 0:33 / /run/gpulet-test-k8s/with\040space rw - tmpfs t rw
`
	got := mountsUnder(strings.NewReader(mi), StateDir, RunDir)
	want := []string{"/var/lib/gpulet-test-k8s/containerd/a/dev/shm", "/var/lib/gpulet-test-k8s/containerd/a", "/run/gpulet-test-k8s/with space"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mountsUnder = %q, want %q (deepest first, only under the roots)", got, want)
	}
}

func FuzzMountsUnder(f *testing.F) {
	f.Add("30 1 0:30 / /var/lib/gpulet-test-k8s/x rw - overlay overlay rw\n")
	f.Add(`1 2 3 4 /run/gpulet-test-k8s\0`)
	f.Fuzz(func(t *testing.T, mi string) {
		for _, mp := range mountsUnder(strings.NewReader(mi), StateDir, RunDir) {
			if mp != StateDir && mp != RunDir && !strings.HasPrefix(mp, StateDir+"/") && !strings.HasPrefix(mp, RunDir+"/") {
				t.Fatalf("mountsUnder gave %q, outside the roots", mp)
			}
		}
	})
}

// TestWriteArchive reads an image archive back as containerd does: the
// manifest names the config and the layers, the config's diff_ids are the
// layers' digests, and a layer has each file, link and folder on the way.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	os.WriteFile(src, []byte("#!binary"), 0o755)
	out := filepath.Join(dir, "img.tar")
	img := Image{Ref: "localhost/x:1", Entrypoint: []string{"/usr/bin/x"}, Layers: []Layer{
		{{Name: "/usr/bin/x", Src: src}, {Name: "/lib64/ld.so", Link: "/lib/ld.so"}},
		{{Name: "/tmp", Mode: 0o777 | os.ModeSticky}, {Name: "/etc/passwd", Data: []byte("root:x:0:0::/:/bin/sh\n"), Mode: 0o644}},
	}}
	if err := WriteArchive(out, img); err != nil {
		t.Fatal(err)
	}
	files := readTar(t, out)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"].data, &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"].data)
	}
	m := manifest[0]
	if !reflect.DeepEqual(m.RepoTags, []string{img.Ref}) || len(m.Layers) != 2 {
		t.Fatalf("manifest %+v", m)
	}
	var cfg struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(files[m.Config].data, &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Config.Entrypoint, img.Entrypoint) || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("config %+v", cfg)
	}
	for i, l := range m.Layers {
		if want := "sha256:" + strings.TrimSuffix(l, "/layer.tar"); cfg.RootFS.DiffIDs[i] != want {
			t.Errorf("layer %d: diff_id %s, file %s", i, cfg.RootFS.DiffIDs[i], l)
		}
	}
	l0 := readTarBytes(t, files[m.Layers[0]].data)
	if string(l0["usr/bin/x"].data) != "#!binary" || l0["usr/bin/x"].mode != 0o755 {
		t.Errorf("layer 0 usr/bin/x: %+v", l0["usr/bin/x"])
	}
	if l0["lib64/ld.so"].link != "/lib/ld.so" || l0["usr/"].typ != tar.TypeDir || l0["usr/bin/"].typ != tar.TypeDir {
		t.Errorf("layer 0: %+v", l0)
	}
	l1 := readTarBytes(t, files[m.Layers[1]].data)
	if l1["tmp/"].mode != 0o1777 || l1["etc/passwd"].mode != 0o644 {
		t.Errorf("layer 1: /tmp mode %o, /etc/passwd mode %o", l1["tmp/"].mode, l1["etc/passwd"].mode)
	}
}

type tarEntry struct {
	data []byte
	mode int64
	link string
	typ  byte
}

func readTar(t *testing.T, path string) map[string]tarEntry {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return readTarBytes(t, b)
}

func readTarBytes(t *testing.T, b []byte) map[string]tarEntry {
	t.Helper()
	out := map[string]tarEntry{}
	r := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(r)
		out[h.Name] = tarEntry{data: data, mode: h.Mode, link: h.Linkname, typ: h.Typeflag}
	}
}

// TestRestoreSysctlsValidatesKeys: the saved file is written back into
// /proc/sys only for the sysctls the kubelet changes.
func TestRestoreSysctlsValidatesKeys(t *testing.T) {
	for _, k := range []string{"vm/overcommit_memory", "kernel/panic"} {
		if !validSysctl(k) {
			t.Errorf("%s refused", k)
		}
	}
	for _, k := range []string{"kernel/core_pattern", "../../etc/passwd", ""} {
		if validSysctl(k) {
			t.Errorf("%s taken", k)
		}
	}
}

func TestKubeletConfigFeatureGates(t *testing.T) {
	got := kubeletConfig("/pki", 1, 2, map[string]bool{"B": false, "A": true})
	if !strings.HasSuffix(got, "featureGates:\n  A: true\n  B: false\n") || !strings.Contains(got, "failCgroupV1: false") {
		t.Errorf("kubelet config:\n%s", got)
	}
	if g := gateFlag(map[string]bool{"B": false, "A": true}); g != "A=true,B=false" {
		t.Errorf("gateFlag = %q", g)
	}
}

func TestParseSavedSysctls(t *testing.T) {
	got, err := parseSavedSysctls("vm/overcommit_memory=0\nkernel/panic=10\n")
	if err != nil || !reflect.DeepEqual(got, [][2]string{{"vm/overcommit_memory", "0"}, {"kernel/panic", "10"}}) {
		t.Errorf("parseSavedSysctls = %v, %v", got, err)
	}
	for _, bad := range []string{"kernel/core_pattern=|/bin/sh", "kernel/panic=1 0", "kernel/panic", "../../etc/x=1", "kernel/panic=x"} {
		if _, err := parseSavedSysctls(bad); err == nil {
			t.Errorf("parseSavedSysctls(%q) took it", bad)
		}
	}
}

func FuzzParseSavedSysctls(f *testing.F) {
	f.Add("vm/overcommit_memory=0\nkernel/panic=10\n")
	f.Add("kernel/panic=\n=")
	f.Fuzz(func(t *testing.T, text string) {
		kvs, err := parseSavedSysctls(text)
		if err != nil {
			return
		}
		for _, kv := range kvs {
			if !validSysctl(kv[0]) || strings.ContainsAny(kv[1], " \n/") {
				t.Fatalf("parseSavedSysctls(%q) took %q", text, kv)
			}
		}
	})
}

func TestParsePidFile(t *testing.T) {
	if pid, bin, ok := parsePidFile("123\n/usr/bin/etcd\n"); !ok || pid != 123 || bin != "/usr/bin/etcd" {
		t.Errorf("parsePidFile = %d %q %t", pid, bin, ok)
	}
	for _, bad := range []string{"1\n/sbin/init\n", "0\n/x", "12", "x\n/x", "12\nrelative"} {
		if _, _, ok := parsePidFile(bad); ok {
			t.Errorf("parsePidFile(%q) took it", bad)
		}
	}
}

func FuzzParsePidFile(f *testing.F) {
	f.Add("123\n/usr/bin/etcd\n")
	f.Add("-1\n/\n")
	f.Fuzz(func(t *testing.T, text string) {
		if pid, bin, ok := parsePidFile(text); ok && (pid <= 1 || !strings.HasPrefix(bin, "/")) {
			t.Fatalf("parsePidFile(%q) = %d %q", text, pid, bin)
		}
	})
}

// TestLockWaitsForTheHolder: a second cluster waits for the first one's
// lock, says so once, and gets it when the first lets go.
func TestLockWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := lock(context.Background(), path, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	logf := func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) }
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if _, err := lock(ctx, path, logf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second lock while the first is held: %v, want to wait until the context ends", err)
	}
	if len(said) != 1 || !strings.Contains(said[0], "waiting for it to stop") {
		t.Errorf("the waiting lock said %q, want one line that it waits", said)
	}
	first.unlock()
	second, err := lock(context.Background(), path, logf)
	if err != nil {
		t.Fatalf("the lock once the first let go: %v", err)
	}
	second.unlock()
}
