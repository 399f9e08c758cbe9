package cripull

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// WriteMirrorHosts writes CRI's deprecated registry.mirrors as a hosts.toml
// tree under dir, so pulls resolve them through the same hosts.toml path
// (config.ConfigureHosts) as every other pull, and the pull source, the
// registry-health memory and the timeouts apply to them too. Each host
// gets its mirror endpoints in order, then its default endpoint, as CRI's
// local pull path orders them ("*" is _default). CRI ignores
// registry.configs' TLS settings on that path, so they are not written.
func WriteMirrorHosts(dir string, mirrors map[string]criconfig.Mirror) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	names := make([]string, 0, len(mirrors))
	for h := range mirrors {
		names = append(names, h)
	}
	sort.Strings(names)
	for _, h := range names {
		body, err := mirrorHostsTOML(h, mirrors[h].Endpoints)
		if err != nil {
			return fmt.Errorf("registry.mirrors.%q: %w", h, err)
		}
		sub := h
		if h == "*" {
			sub = "_default"
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, sub, "hosts.toml"), []byte(body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// mirrorHostsTOML is one host's hosts.toml. The registry itself stays last
// (server); an endpoint naming it becomes the server, which moves it to
// the end if it was listed earlier: hosts.toml always tries server last.
func mirrorHostsTOML(host string, endpoints []string) (string, error) {
	var b strings.Builder
	var server string
	if host != "*" {
		d, err := docker.DefaultHost(host)
		if err != nil {
			return "", err
		}
		server = defaultScheme(d) + "://" + d
	}
	var hosts []string
	seen := map[string]bool{}
	for _, e := range endpoints {
		if !strings.Contains(e, "://") {
			u, err := url.Parse("dummy://" + e)
			if err != nil {
				return "", fmt.Errorf("endpoint %q: %w", e, err)
			}
			e = defaultScheme(u.Host) + "://" + e
		}
		u, err := url.Parse(e)
		if err != nil {
			return "", fmt.Errorf("endpoint %q: %w", e, err)
		}
		// CRI would try a repeated endpoint twice; hosts.toml refuses a
		// repeated host table, and with it the whole file.
		if seen[e] {
			continue
		}
		seen[e] = true
		if host != "*" && u.Host == host {
			server = e
			continue
		}
		hosts = append(hosts, e)
	}
	if server != "" {
		fmt.Fprintf(&b, "server = %s\n", strconv.Quote(server))
		if hasPath(server) {
			b.WriteString("override_path = true\n")
		}
	}
	for _, e := range hosts {
		fmt.Fprintf(&b, "\n[host.%s]\n  capabilities = [\"pull\", \"resolve\"]\n", strconv.Quote(e))
		if hasPath(e) {
			b.WriteString("  override_path = true\n")
		}
	}
	return b.String(), nil
}

// hasPath reports whether an endpoint names its own API root: CRI's local
// path then uses it as is, with /v2 only when there is none, where
// hosts.toml would append /v2.
func hasPath(endpoint string) bool {
	u, err := url.Parse(endpoint)
	return err == nil && u.Path != "" && u.Path != "/"
}

// defaultScheme is CRI's: plain HTTP for localhost, else HTTPS.
func defaultScheme(host string) string {
	if docker.IsLocalhost(host) {
		return "http"
	}
	return "https"
}
