package fsview

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/snapshot"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// BenchmarkReadFreeUnits measures what `cat free_units` costs: open, read to
// EOF, close. It compares the view with the same bytes in a tmpfs file (no
// FUSE at all) and in a minimal go-fuse direct-I/O filesystem of one file, the
// floor for any go-fuse file rendered at open.
func BenchmarkReadFreeUnits(b *testing.B) {
	requireFUSE(b)
	var store snapshot.Store
	store.Store(publish(b, testSnapshot(7, 28)))
	want := "28\n"

	b.Run("fsview", func(b *testing.B) {
		_, dir := mountView(b, &store)
		readLoop(b, filepath.Join(dir, "free_units"), want)
	})

	b.Run("tmpfs", func(b *testing.B) {
		base := "/dev/shm"
		if st, err := os.Stat(base); err != nil || !st.IsDir() {
			b.Skip("no /dev/shm")
		}
		dir, err := os.MkdirTemp(base, "fsview-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		path := filepath.Join(dir, "free_units")
		if err := os.WriteFile(path, []byte(want), 0o444); err != nil {
			b.Fatal(err)
		}
		readLoop(b, path, want)
	})

	b.Run("gofuse-floor", func(b *testing.B) {
		dir := b.TempDir()
		root := &fs.Inode{}
		// libfuse's default timeouts, so that the kernel skips the LOOKUP
		// and GETATTR the view cannot skip: the floor is as low as go-fuse goes.
		sec := time.Second
		server, err := fs.Mount(dir, root, &fs.Options{
			MountOptions: fuse.MountOptions{DirectMount: true},
			EntryTimeout: &sec,
			AttrTimeout:  &sec,
			OnAdd: func(ctx context.Context) {
				f := root.NewPersistentInode(ctx, &floorFile{data: []byte(want)}, fs.StableAttr{Mode: syscall.S_IFREG})
				root.AddChild("free_units", f, true)
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { server.Unmount() })
		readLoop(b, filepath.Join(dir, "free_units"), want)
	})
}

// readLoop opens, reads to EOF and closes path b.N times, as cat does.
func readLoop(b *testing.B, path, want string) {
	buf := make([]byte, 4096)
	read := func() int {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		total := 0
		for {
			n, err := syscall.Read(fd, buf[total:])
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			total += n
		}
		syscall.Close(fd)
		return total
	}
	if n := read(); string(buf[:n]) != want {
		b.Fatalf("%s = %q, want %q", path, buf[:n], want)
	}
	for b.Loop() {
		read()
	}
}

// floorFile is the smallest go-fuse file rendered at open: fixed bytes, direct
// I/O, nothing else.
type floorFile struct {
	fs.Inode
	data []byte
}

func (f *floorFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return floorHandle(f.data), fuse.FOPEN_DIRECT_IO, 0
}

type floorHandle []byte

func (h floorHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	end := min(off+int64(len(dest)), int64(len(h)))
	return fuse.ReadResultData(h[min(off, end):end]), 0
}
