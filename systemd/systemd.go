// Package systemd is gpuletd's glue to systemd, beside the unit files it goes
// with: the socket passed by socket activation, and the notify protocol
// (READY, STOPPING, WATCHDOG). Outside systemd every call does nothing.
package systemd

import (
	"net"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
)

// Listener returns the first socket systemd passed, or nil when there is none.
func Listener() net.Listener {
	lns, err := activation.Listeners()
	if err != nil || len(lns) == 0 {
		return nil
	}
	return lns[0]
}

// Ready tells systemd that the daemon serves.
func Ready() { daemon.SdNotify(false, daemon.SdNotifyReady) }

// Stopping tells systemd that the daemon is stopping.
func Stopping() { daemon.SdNotify(false, daemon.SdNotifyStopping) }

// Watchdog tells systemd's watchdog that the daemon made progress.
func Watchdog() { daemon.SdNotify(false, daemon.SdNotifyWatchdog) }

// WatchdogInterval is how often Watchdog must be called for systemd's
// watchdog (WatchdogSec=) not to kill the daemon: half its timeout, as
// sd_watchdog_enabled(3) advises; 0 when there is no watchdog.
func WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0
	}
	return d / 2
}
