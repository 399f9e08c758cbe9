package peers

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any goroutine is left once every test
// has closed its nodes: each one a node starts must end on Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
