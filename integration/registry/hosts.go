package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteHosts writes dir/host/hosts.toml: registry host is served at server
// (a URL), behind mirror (a URL, none when empty) with caps. containerd
// reads hosts.toml on every pull, so a running daemon needs no restart.
func WriteHosts(dir, host, server, mirror string, caps ...string) error {
	hostDir := filepath.Join(dir, host)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return fmt.Errorf("write hosts.toml for %s: %w", host, err)
	}
	hosts := fmt.Sprintf("server = %q\n", server)
	if mirror != "" {
		hosts += fmt.Sprintf("\n[host.%q]\n  capabilities = [%s]\n", mirror, `"`+strings.Join(caps, `", "`)+`"`)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("write hosts.toml for %s: %w", host, err)
	}
	return nil
}
