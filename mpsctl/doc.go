// Package mpsctl starts, adopts, checks, restarts and stops the NVIDIA MPS control
// daemons (nvidia-cuda-mps-control) that gpuletd runs: K daemons ("instances") per
// GPU, instance k of GPU u living under <run-dir>/mps/<u>/<k>/{pipe,log}.
//
// It owns those processes and folders and nothing else: it does not decide which
// instance a lease goes to, does not count units, and never talks to an MPS server
// or client. With MPS off (an empty [Config.Control]) a [Daemons] is a null manager:
// every method works, nothing is started, and instances report [api.InstanceOff].
//
// # What the control binary does (driver 535, Debian package nvidia-cuda-mps)
//
// These facts were found by running /usr/bin/nvidia-cuda-mps-control on a machine
// without a GPU; the choices below rest on them.
//
//   - "-d" forks, the child calls daemon(3) (seen in ps and /proc: a new session,
//     parent init, fds 0-2 on /dev/null) and the first process exits 0 once the daemon listens, within a few
//     milliseconds. The daemon is therefore not gpuletd's child and survives it; no
//     pipe of ours stays open in it, so waiting for the "-d" process is enough.
//   - In CUDA_MPS_PIPE_DIRECTORY it creates control (socket, 0666: every user's
//     clients connect here), control_privileged (socket, 0755: root's commands),
//     control_lock (plain file, 0666) and log (FIFO). It writes no pid file. It
//     holds a POSIX record lock on control_lock for its whole life; a second "-d" on
//     the same folder sees the lock, prints "An instance of this daemon is already
//     running" on stdout and exits 1. F_GETLK on control_lock therefore names the
//     daemon's pid, which is how this package finds it (see lockHolder).
//   - In CUDA_MPS_LOG_DIRECTORY it appends to control.log and creates server.log,
//     keeping both open with O_APPEND for its whole life and never rotating them.
//     It logs every connection and command: six lines, about 340 bytes, for each
//     health probe, so 29 MB a day per instance at a sample interval of 1s, on a
//     tmpfs. No probe escapes this (merely connecting is logged), so Check cuts the
//     files instead: a truncated file takes the daemon's next line at offset 0
//     (tried with the real binary).
//   - After "quit" or SIGKILL the sockets and control_lock stay behind ("quit" only
//     removes the FIFO). A new "-d" replaces them, but a stale 0666 control_lock could
//     be locked by any user to block the restart, so this package removes the known
//     stale names (only those, never through a symlink) before it starts a daemon.
//   - The pipe folder path must be at most 87 bytes: with a longer one the daemon
//     cannot bind control_privileged (a Unix socket path is limited to 108 bytes),
//     and "-d" exits 1 without a word. [New] refuses such a run dir; [Open] with
//     "auto" runs on without MPS.
//   - Without arguments the binary is a front end that sends each stdin line as a
//     command and prints the answers; several commands may share one run, which is
//     how one probe asks two questions. With no daemon it prints "Cannot find MPS
//     control daemon process" on stderr and exits 1. A daemon that is stopped
//     (SIGSTOP) accepts the connection and never answers, so every run has a
//     timeout.
//   - get_default_active_thread_percentage answers "100.0" and changes nothing: it
//     is the health probe. get_server_list prints one server pid a line (nothing
//     when no server runs); get_client_list PID prints one client pid a line. An
//     unknown command prints `Unknown command "x"` and still exits 0, so answers are
//     parsed, never trusted from the exit status.
//   - "quit" makes the daemon stop accepting clients, wait for every server and its
//     clients to finish, and exit; the front end waits for that (so says the manual
//     page; without a GPU no client can be shown). Without servers it exits at once
//     and removes only its FIFO. Sent to a daemon
//     whose server has clients it would block new clients until they all end, so
//     Close only quits instances without clients and leaves the others running.
//   - Without a GPU the daemon starts a server on demand (start_server -uid N), which
//     exits at once with status 1, so tests with the real binary never see a live
//     server or clients.
//   - This version has no multi-user mode: -h and the manual page list only -d and
//     -f, strings(1) of the binary shows no such option, and the manual says one
//     server runs at a time and a client of another user waits until the current
//     server has drained. Instance status therefore carries the uid of the live
//     server, so that leases of different users can be kept on different instances.
package mpsctl
