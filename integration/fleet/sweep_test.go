package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

// TestSweepLeftovers: a namespace that a run which is gone left behind
// is removed, with what still ran in it, also while the run's process is
// a zombie not yet reaped; one of a live process is kept.
func TestSweepLeftovers(t *testing.T) {
	// A PID that no process has now: one that has just exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	// One that has exited and is not reaped until the test ends.
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })
	await.Until(t, 10*time.Second, "a zombie", func() bool { return !alive(zombie.Process.Pid) })

	dead := fmt.Sprintf("%s%d-1-hub", Prefix, gone.Process.Pid)
	undead := fmt.Sprintf("%s%d-1-hub", Prefix, zombie.Process.Pid)
	live := fmt.Sprintf("%s%d-1-hub", Prefix, os.Getppid())
	for _, ns := range []string{dead, undead, live} {
		if err := ip("ip", "netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ip("ip", "netns", "del", ns) })
	}
	// Something left running in the dead run's namespace.
	sleeper := exec.Command("nsenter", "--net="+netnsDir+dead, "--", "sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	t.Cleanup(func() { _ = sleeper.Process.Kill() })
	await.Until(t, 10*time.Second, "the process to enter "+dead, func() bool {
		in, err1 := os.Stat(fmt.Sprintf("/proc/%d/ns/net", sleeper.Process.Pid))
		ns, err2 := os.Stat(netnsDir + dead)
		return err1 == nil && err2 == nil && os.SameFile(in, ns)
	})

	if err := sweep(); err != nil {
		t.Fatal(err)
	}
	names, err := Namespaces(Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, dead) || slices.Contains(names, undead) || !slices.Contains(names, live) {
		t.Errorf("after the sweep: %v; want %s and %s gone, %s kept", names, dead, undead, live)
	}
	if err := <-exited; err == nil {
		t.Errorf("the process left in %s exited by itself, want it killed", dead)
	}
}
