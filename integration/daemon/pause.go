package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var pauseBuild struct {
	once sync.Once
	bin  []byte
	err  error
}

// PauseBinary returns a static build of integration/testdata/pause (it
// blocks until SIGTERM or SIGINT), built once per test process: the
// sandbox and container process of the test pods, so no image comes from
// outside the machine.
func PauseBinary(t testing.TB) []byte {
	t.Helper()
	pauseBuild.once.Do(func() {
		// Found from the module's root, not from this file's path, which
		// a build with -trimpath (as `make` builds) does not record.
		env, err := exec.Command("go", "env", "GOMOD").Output()
		gomod := strings.TrimSpace(string(env))
		if err != nil || !filepath.IsAbs(gomod) {
			pauseBuild.err = fmt.Errorf("cannot locate integration/testdata/pause: go env GOMOD: %q, %v", gomod, err)
			return
		}
		src := filepath.Join(filepath.Dir(gomod), "integration", "testdata", "pause")
		dir, err := os.MkdirTemp("", "pullwise-pause-")
		if err != nil {
			pauseBuild.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "pause")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if b, err := cmd.CombinedOutput(); err != nil {
			pauseBuild.err = fmt.Errorf("go build %s: %v\n%s", src, err, b)
			return
		}
		pauseBuild.bin, pauseBuild.err = os.ReadFile(out)
	})
	if pauseBuild.err != nil {
		t.Fatal(pauseBuild.err)
	}
	return pauseBuild.bin
}
