package agent

import (
	"log/slog"
	"syscall"
)

// raiseFileLimit raises the soft limit on open files to the hard limit, so
// that the connection caps and the descriptor reserve (agent/server), not a
// low default soft limit, decide when connections are refused. Go's runtime
// already raises it to one below the hard limit at start, and then gives
// child processes the original soft limit back; calling syscall.Setrlimit
// would stop that, so this raises only what the runtime left low (with a
// hard limit set to "unlimited", say) and otherwise just reports the limit.
func raiseFileLimit(log *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open file limit", "err", err)
		return
	}
	if lim.Cur+1 < lim.Max {
		want := lim
		want.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			log.Warn("cannot raise the open file limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
			return
		}
		lim = want
	}
	log.Info("open file limit", "soft", lim.Cur, "hard", lim.Max)
}
