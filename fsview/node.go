package fsview

import (
	"context"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/snapshot"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// cacheTimeout is how long the kernel may keep what cannot change while the view
// is mounted: the layout's fixed names and the attributes of directories.
// Everything else (GPU and lease names, file sizes, link targets) gets a zero
// timeout and file bytes are served with direct I/O, so nothing the kernel keeps
// can be older than the current snapshot.
const cacheTimeout = time.Hour

// tree is what every node of one mount shares.
type tree struct {
	src Source
	// mounted is the time directories show; files show the snapshot's time.
	mounted time.Time
}

// node is any name of the view. It holds no data: every operation asks the
// layout (tree.go) about the snapshot current at that moment.
type node struct {
	fs.Inode
	t    *tree
	path string // relative to the root; "" is the root
	kind kind
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
)

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := n.t.src.Load()
	path := join(n.path, name)
	e, ok := lookup(p, path)
	if !ok {
		return nil, syscall.ENOENT
	}
	n.t.fill(&out.Attr, e, p)
	if e.static {
		out.SetEntryTimeout(cacheTimeout)
	}
	out.SetAttrTimeout(attrTimeout(e.kind))
	child := &node{t: n.t, path: path, kind: e.kind}
	// A stable inode number per path lets go-fuse hand the kernel the node it
	// already knows, so revalidating a dynamic name does not churn inodes.
	return n.NewInode(ctx, child, fs.StableAttr{Mode: e.kind.mode(), Ino: inode(e.kind, path)}), 0
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	names, ok := list(n.t.src.Load(), n.path)
	if !ok {
		return nil, syscall.ENOENT
	}
	out := make([]fuse.DirEntry, len(names))
	for i, d := range names {
		out[i] = fuse.DirEntry{Name: d.name, Mode: d.kind.mode(), Ino: inode(d.kind, join(n.path, d.name))}
	}
	return fs.NewListDirStream(out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e, ok := lookup(nil, n.path); ok && e.static && e.kind == kindDir {
		// The layout's fixed folders look the same whatever the snapshot,
		// so none is asked for: the kernel's first look at the root, while
		// the view is mounted, comes before gpuletd serves its API.
		n.t.fill(&out.Attr, e, nil)
		out.SetTimeout(attrTimeout(e.kind))
		return 0
	}
	var p *snapshot.Published
	if l, ok := n.t.src.(latestSource); ok {
		p = l.Latest()
	}
	if p == nil {
		p = n.t.src.Load()
	}
	e, ok := lookup(p, n.path)
	if !ok || e.kind != n.kind {
		return syscall.ENOENT
	}
	n.t.fill(&out.Attr, e, p)
	if h, ok := f.(*handle); ok && time.Since(h.opened) < latestFor {
		// Asked through an open file (fstat, lseek's SEEK_END): its size is
		// that of the bytes it reads, which may be of another snapshot
		// than p, else tail -n or wc -c would cut or pad them. go-fuse
		// passes some open file of the node where the kernel names none
		// (fstat, stat by path), maybe another reader's: one opened
		// longer ago than a stat may be old is not asked.
		out.Size = uint64(len(h.data))
	}
	out.SetTimeout(attrTimeout(e.kind))
	return 0
}

// Open renders the file from the current snapshot into the handle, so that one
// open reads one snapshot however the reads are split.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EROFS
	}
	p := n.t.src.Load()
	if current(p) == nil {
		// The daemon has published nothing yet: the names are there, the values
		// are not.
		return nil, 0, syscall.EAGAIN
	}
	data, ok := render(p, n.path)
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	return &handle{data: data, opened: time.Now()}, fuse.FOPEN_DIRECT_IO, 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	e, ok := lookup(n.t.src.Load(), n.path)
	if !ok || e.kind != kindLink {
		return nil, syscall.ENOENT
	}
	return e.data, 0
}

// The view is read-only. The mount is read-only too, so the kernel refuses these
// before they get here; they answer EROFS all the same, because go-fuse's
// defaults would report success for some (Unlink, Rmdir).

func (n *node) Setattr(context.Context, fs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

func (n *node) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (n *node) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (n *node) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (n *node) Symlink(context.Context, string, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (n *node) Link(context.Context, fs.InodeEmbedder, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (n *node) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }

func (n *node) Rmdir(context.Context, string) syscall.Errno { return syscall.EROFS }

func (n *node) Rename(context.Context, string, fs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EROFS
}

// handle is one open file: the bytes rendered at Open, and when.
type handle struct {
	data   []byte
	opened time.Time
}

var (
	_ fs.FileReader  = (*handle)(nil)
	_ fs.FileFlusher = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 || off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.data)))
	return fuse.ReadResultData(h.data[off:end]), 0
}

// Flush answers ENOSYS, which the kernel remembers for the whole mount: a view
// file has nothing to flush, and every close then saves a round trip.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

// fill sets out to the attributes of e, a name of p.
func (t *tree) fill(out *fuse.Attr, e entry, p *snapshot.Published) {
	out.Mode = e.kind.mode() | e.perm
	out.Size = uint64(len(e.data))
	out.Nlink = 1
	out.Uid, out.Gid = e.uid, e.gid
	mtime := t.mounted
	if s := current(p); s != nil && e.kind != kindDir {
		mtime = s.Time
	}
	out.SetTimes(&mtime, &mtime, &mtime)
}

func attrTimeout(k kind) time.Duration {
	if k == kindDir {
		// A directory's mode and owner never change; its contents are not
		// attributes.
		return cacheTimeout
	}
	return 0
}

func (k kind) mode() uint32 {
	switch k {
	case kindDir:
		return syscall.S_IFDIR
	case kindLink:
		return syscall.S_IFLNK
	}
	return syscall.S_IFREG
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// inode numbers a path of the view stably across lookups and snapshots, clear of
// the root (1) and of go-fuse's automatic numbers (from 2^63).
func inode(k kind, path string) uint64 {
	// FNV-1a, inline to keep lookups free of allocations.
	h := uint64(14695981039346656037)
	h = (h ^ uint64(k)) * 1099511628211
	for i := 0; i < len(path); i++ {
		h = (h ^ uint64(path[i])) * 1099511628211
	}
	return max(h>>1, 2)
}
