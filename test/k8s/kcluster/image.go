package kcluster

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Image is a container image to write as an archive that containerd
// imports (docker save's format): layers of files, and the config.
type Image struct {
	Ref        string // e.g. localhost/gpulet/gpuletd:test
	Entrypoint []string
	Env        []string
	Layers     []Layer
}

// Layer is one layer's files; the folders on their way are made.
type Layer []File

// File is one entry of a layer: a copy of the host file Src, or Data, or a
// symbolic link to Link, or (all three empty) a folder.
type File struct {
	Name string // path in the image, e.g. /usr/local/bin/gpuletd
	Src  string
	Data []byte
	Link string
	Mode os.FileMode // permission bits (and sticky); 0755 or 0644 when 0
}

// epoch dates every entry, so that one input gives one image.
var epoch = time.Unix(0, 0).UTC()

// WriteArchive writes img to out.
func WriteArchive(out string, img Image) error {
	var diffIDs, layerNames []string
	var layers [][]byte
	for i, l := range img.Layers {
		b, err := l.tar()
		if err != nil {
			return fmt.Errorf("image %s, layer %d: %w", img.Ref, i, err)
		}
		sum := sha256.Sum256(b)
		diffIDs = append(diffIDs, "sha256:"+hex.EncodeToString(sum[:]))
		layerNames = append(layerNames, hex.EncodeToString(sum[:])+"/layer.tar")
		layers = append(layers, b)
	}
	cfg, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": epoch.Format(time.RFC3339),
		"config": map[string]any{"Entrypoint": img.Entrypoint, "Env": img.Env},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return err
	}
	cs := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(cs[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{img.Ref}, "Layers": layerNames}})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	add := func(name string, b []byte) error {
		if err := w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := w.Write(b)
		return err
	}
	if err := add(cfgName, cfg); err != nil {
		return err
	}
	for i, l := range layers {
		if err := add(layerNames[i], l); err != nil {
			return err
		}
	}
	if err := add("manifest.json", manifest); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// tar is the layer as an uncompressed tar, folders first, in name order.
func (l Layer) tar() ([]byte, error) {
	entries := map[string]File{}
	for _, f := range l {
		name := strings.TrimPrefix(path.Clean("/"+f.Name), "/")
		if name == "" {
			return nil, fmt.Errorf("file %q: no name", f.Name)
		}
		entries[name] = f
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = File{Name: d}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, n := range names {
		f := entries[n]
		h := &tar.Header{Name: n, ModTime: epoch, Mode: int64(f.Mode & (os.ModePerm | os.ModeSticky))}
		data := f.Data
		switch {
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.Src != "" || f.Data != nil:
			if f.Src != "" {
				b, err := os.ReadFile(f.Src)
				if err != nil {
					return nil, err
				}
				data = b
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		default:
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		}
		if f.Mode&os.ModeSticky != 0 {
			h.Mode = int64(f.Mode&os.ModePerm) | 0o1000
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := w.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SharedLibraries are the files a dynamically linked binary loads, as ldd
// names them, each with the links on its way: what a layer needs for the
// binary to start in an image of its own.
func SharedLibraries(bin string) (Layer, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var layer Layer
	seen := map[string]bool{}
	for _, p := range parseLdd(string(out)) {
		for !seen[p] {
			seen[p] = true
			fi, err := os.Lstat(p)
			if err != nil {
				return nil, err
			}
			if fi.Mode()&os.ModeSymlink == 0 {
				layer = append(layer, File{Name: p, Src: p, Mode: 0o755})
				break
			}
			target, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			layer = append(layer, File{Name: p, Link: target})
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			p = target
		}
	}
	return layer, nil
}

// parseLdd reads ldd's output: the absolute path of each library found,
// "libc.so.6 => /lib/.../libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2
// (0x...)"; the vDSO and libraries not found have none.
func parseLdd(out string) []string {
	var paths []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if _, after, ok := strings.Cut(line, "=>"); ok {
			line = strings.TrimSpace(after)
		}
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], "/") {
			paths = append(paths, path.Clean(f[0]))
		}
	}
	return paths
}
