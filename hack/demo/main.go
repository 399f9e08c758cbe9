// Command pullwise-demo shows Pullwise at work on this machine alone, for
// `make demo`: it starts a loopback registry, a pull-through mirror in
// front of it and a Pullwise containerd, everything under one directory,
// then runs pullctl through a few pulls and says what each shows. It stops
// everything it started when it ends, fails or is interrupted.
//
// No pull leaves the machine: image references name the loopback
// registry, and hosts.toml sends them to the loopback mirror.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

func main() { os.Exit(run()) }

// run runs the demo and returns the exit status: 0 when every step ran,
// 1 on an error, 2 when it cannot start, 130 when interrupted.
func run() int {
	dir := flag.String("dir", "_demo", "directory for everything the demo starts; its old contents are replaced")
	bin := flag.String("bin", "bin", "directory holding containerd and pullctl (make build)")
	contrib := flag.String("config", "contrib/config.toml", "example config the daemon's config starts from")
	noPause := flag.Bool("no-pause", false, "do not wait for Enter between steps (it only waits when stdin is a terminal)")
	bandwidth := flag.Int("bandwidth", 4, "MiB/s of each registry's simulated WAN link")
	flag.Parse()

	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "pullwise-demo needs root: containerd mounts image snapshots. Run 'sudo make demo'.")
		return 2
	}
	for _, name := range []string{"containerd", "pullctl"} {
		if _, err := os.Stat(filepath.Join(*bin, name)); err != nil {
			fmt.Fprintf(os.Stderr, "pullwise-demo: %v: run 'make build' first\n", err)
			return 2
		}
	}
	absDir, err := filepath.Abs(*dir)
	if err == nil {
		*bin, err = filepath.Abs(*bin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pullwise-demo: %v\n", err)
		return 2
	}

	// Signals stay caught until run returns, so a second ^C does not cut
	// the cleanup short.
	sig, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithCancel(sig)
	defer cancel()

	s := &stack{
		dir: absDir, bin: *bin, maxPulls: 2,
		wan: registry.WAN{Latency: 20 * time.Millisecond, BytesPerSecond: int64(*bandwidth) << 20},
	}
	tty := term.IsTerminal(int(os.Stdout.Fd()))
	d := &demo{s: s, out: os.Stdout, tty: tty, contrib: *contrib}
	if !*noPause && tty && term.IsTerminal(int(os.Stdin.Fd())) {
		d.enter = readLines(os.Stdin)
	}

	// net/http logs to the standard logger when a cut connection ends a
	// response; that belongs in a file, not amid the demo's output.
	if err := os.MkdirAll(absDir, 0o755); err == nil {
		if f, err := os.Create(s.path("registries.log")); err == nil {
			defer f.Close()
			log.SetOutput(f)
		}
	}

	err = d.run(ctx)
	interrupted := sig.Err() != nil
	switch {
	case interrupted:
		d.heading("Interrupted: stopping everything the demo started")
	case err != nil:
		fmt.Fprintf(os.Stderr, "\npullwise-demo: %v\n", err)
		d.heading("Stopping everything the demo started")
	default:
		d.heading("Done: stopping everything the demo started")
	}
	// Background pulls end first: they talk to the daemon about to stop.
	cancel()
	d.bg.Wait()
	if stopErr := s.stop(); stopErr != nil {
		fmt.Fprintf(os.Stderr, "pullwise-demo: cleanup: %v\n", stopErr)
		return 1
	}
	fmt.Fprintf(d.out, "containerd and both registries stopped; nothing is mounted under %s.\n", s.dir)
	fmt.Fprintf(d.out, "Kept for a look: config.toml, certs.d/, containerd.log and registries.log in %s.\n", s.dir)
	switch {
	case interrupted:
		return 130
	case err != nil:
		return 1
	}
	return 0
}

// prepare empties dir of an earlier run, so the first pull is a first
// pull, after unmounting what a killed run may have left there.
func (s *stack) prepare() error {
	if err := daemon.Unmount(s.dir); err != nil {
		return fmt.Errorf("clean %s: %w", s.dir, err)
	}
	for _, p := range append(s.scratch(), s.path("certs.d"), s.path("containerd.sock"), s.path("containerd.sock.ttrpc")) {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("clean %s: %w", s.dir, err)
		}
	}
	return os.MkdirAll(s.dir, 0o755)
}

// readLines hands each line read from f to the channel. Its goroutine
// blocks in Read until the process exits: a terminal read cannot be
// cancelled, and the demo exits right after it stops waiting.
func readLines(f *os.File) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			ch <- struct{}{}
		}
		close(ch)
	}()
	return ch
}
