package kubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketName is the plugin's socket in the kubelet's device-plugin folder.
const SocketName = "gpulet.sock"

// kubeletSocketName is the kubelet's registration socket in that folder.
const kubeletSocketName = "kubelet.sock"

// registerTimeout bounds one Register call; the kubelet answers at once.
const registerTimeout = 10 * time.Second

// Backoff of retries after the plugin socket could not be served, or a
// registration failed while kubelet.sock exists. A kubelet that restarts
// makes its socket anew, which is watched for, so registration retries are
// only for a kubelet that refuses or is half up.
const (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// settleEvents is how long the registrar waits after a change in the
// folder before it serves and registers: a restarting kubelet removes the
// plugin's socket and makes its own within moments, and the events of one
// restart then make one registration, not two (a second one would make the
// kubelet drop the endpoint it has just taken).
const settleEvents = 50 * time.Millisecond

// registrar serves the plugin's socket and keeps the plugin registered.
// Only its run goroutine uses it after newRegistrar.
type registrar struct {
	p                 *Plugin
	sock, kubeletSock string
	watch             *fsnotify.Watcher
	server            *grpc.Server
	// own is the socket file the server listens on: a Remove event for
	// the socket's name while own is still there is of an earlier one.
	own os.FileInfo
}

// newRegistrar watches the kubelet's folder and serves the plugin socket,
// which it replaces when it is stale; a live one is another gpuletd's.
func newRegistrar(p *Plugin) (*registrar, error) {
	dir := p.cfg.Dir
	r := &registrar{p: p, sock: filepath.Join(dir, SocketName), kubeletSock: filepath.Join(dir, kubeletSocketName)}
	// The kubelet makes the folder; a gpuletd that starts first makes it
	// the way the kubelet would find it.
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--kubelet-dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", r.sock, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("--kubelet-dir: %s answers: another gpuletd already serves the kubelet plugin", r.sock)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching --kubelet-dir: %w", err)
	}
	// Before the socket is served: a kubelet restarting meanwhile is seen.
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching --kubelet-dir %s: %w", dir, err)
	}
	r.watch = w
	if err := r.serve(); err != nil {
		w.Close()
		return nil, err
	}
	return r, nil
}

// serve (re)starts the gRPC server on a fresh socket.
func (r *registrar) serve() error {
	r.stopServer()
	if err := os.Remove(r.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale plugin socket: %w", err)
	}
	ln, err := net.Listen("unix", r.sock)
	if err != nil {
		return fmt.Errorf("--kubelet-dir: serving the plugin socket: %w", err)
	}
	// Removal is the registrar's: closing an old listener must never take a
	// newer socket of the same name with it.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	// Only the kubelet, which runs as root, calls the plugin.
	if err := os.Chmod(r.sock, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("--kubelet-dir: %w", err)
	}
	own, err := os.Lstat(r.sock)
	if err != nil {
		ln.Close()
		return fmt.Errorf("--kubelet-dir: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, r.p)
	r.server, r.own = srv, own
	go srv.Serve(ln)
	return nil
}

func (r *registrar) stopServer() {
	if r.server != nil {
		r.server.Stop()
		r.server = nil
	}
}

// ours says whether the plugin's socket is the one the server listens on.
func (r *registrar) ours() bool {
	fi, err := os.Lstat(r.sock)
	return err == nil && r.own != nil && os.SameFile(fi, r.own)
}

// run registers now and then again whenever the kubelet makes its socket
// anew (it restarted, and removed the plugin's socket on its way up) or the
// plugin's socket goes, until ctx ends.
func (r *registrar) run(ctx context.Context) {
	defer func() {
		r.stopServer()
		if r.ours() {
			os.Remove(r.sock)
		}
		r.watch.Close()
	}()
	log := r.p.log
	retry := time.NewTimer(0)
	defer retry.Stop()
	backoff := retryFirst
	// registered: the kubelet took the plugin; waiting: the lack of a
	// kubelet has been logged, once until one appears.
	registered, waiting := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-r.watch.Errors:
			log.Error("watching the kubelet's device-plugin folder", "dir", r.p.cfg.Dir, "err", err)
			continue
		case ev := <-r.watch.Events:
			switch {
			case ev.Name == r.kubeletSock && ev.Has(fsnotify.Create):
				// Every creation of the kubelet's socket is a kubelet
				// (re)starting, and is registered with, even right after a
				// registration: a recreated socket may well get the inode
				// of the old one (ext4 reuses them), so no file identity
				// tells a new kubelet from the one already registered with,
				// and registering twice with one kubelet is harmless.
				r.p.settle()
				log.Info("the kubelet (re)started: registering again", "socket", r.kubeletSock)
			case ev.Name == r.sock && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && !r.ours():
				log.Warn("the kubelet plugin socket was removed: serving it anew and registering again", "socket", r.sock)
			default:
				continue
			}
			registered = false
			// The plugin's socket is served anew only when it is no longer
			// the one the server listens on.
			if !r.ours() {
				r.stopServer()
			}
			retry.Reset(settleEvents)
			continue
		case <-retry.C:
		}
		if registered {
			continue
		}
		// Served anew after an event, or again after a failure.
		if r.server == nil {
			if err := r.serve(); err != nil {
				log.Error("cannot serve the kubelet plugin; retrying", "in", backoff, "err", err)
				retry.Reset(backoff)
				backoff = min(2*backoff, retryMax)
				continue
			}
		}
		if _, err := os.Stat(r.kubeletSock); err != nil {
			// No kubelet yet: its socket's creation is watched for.
			if !waiting {
				log.Info("waiting for the kubelet: its registration socket is not there yet; the plugin registers once it appears", "socket", r.kubeletSock)
				waiting = true
			}
			continue
		}
		waiting = false
		if err := r.register(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("cannot register with the kubelet; retrying", "socket", r.kubeletSock, "in", backoff, "err", err)
			retry.Reset(backoff)
			backoff = min(2*backoff, retryMax)
			continue
		}
		registered, backoff = true, retryFirst
		log.Info("registered with the kubelet", "resource", ResourceName, "socket", r.sock)
	}
}

// register asks the kubelet to use the plugin for ResourceName.
func (r *registrar) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+r.kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     SocketName,
		ResourceName: ResourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}
