package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/platforms"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// stack is what the demo runs: an upstream registry and a pull-through
// mirror of it, each reached through a WAN-like front, and a Pullwise
// containerd configured to pull upstream's images through the mirror.
// Everything lives under dir.
type stack struct {
	dir, bin string
	wan      registry.WAN
	maxPulls int
	// The registries: upstream is seeded directly and is the mirror's
	// remote. containerd reaches each through its front.
	upstreamReg, mirrorReg *registry.Registry
	upstream, mirror       *registry.Front
	containerd             *exec.Cmd
	exited                 chan struct{}
	conn                   *grpc.ClientConn
	api                    api.PullwiseClient
}

// Paths under dir. The ones holding the daemon's data and the registries'
// blobs are removed on exit; config, hosts.toml and the log stay for a look.
func (s *stack) path(p ...string) string { return filepath.Join(append([]string{s.dir}, p...)...) }

func (s *stack) scratch() []string {
	return []string{s.path("root"), s.path("state"), s.path("opt"), s.path("registries")}
}

// startRegistries starts both registries and their fronts.
func (s *stack) startRegistries() error {
	var err error
	if s.upstreamReg, err = registry.New(s.path("registries", "upstream"), registry.Options{Name: "upstream"}); err != nil {
		return err
	}
	if s.mirrorReg, err = registry.New(s.path("registries", "mirror"), registry.Options{Name: "mirror", ProxyRemoteURL: s.upstreamReg.URL()}); err != nil {
		return err
	}
	if s.upstream, err = s.upstreamReg.ListenWAN(s.wan); err != nil {
		return err
	}
	if s.mirror, err = s.mirrorReg.ListenWAN(s.wan); err != nil {
		return err
	}
	// Image references name the upstream front; hosts.toml puts the mirror
	// in front of it, as a node's mirror config does.
	return registry.WriteHosts(s.path("certs.d"), s.upstream.Host(), s.upstream.URL(), s.mirror.URL(), "pull", "resolve")
}

// ref is the reference of repo:tag at upstream, the name a pod spec uses.
func (s *stack) ref(img demoImage) string { return s.upstream.Host() + "/" + img.repo + ":" + img.tag }

// writeConfig writes dir/config.toml: contrib/config.toml with paths moved
// under dir, no metrics port (a fixed one could clash), the demo's pull
// limit, and the snapshotter that mounts here.
func (s *stack) writeConfig(contrib string) error {
	b, err := os.ReadFile(contrib)
	if err != nil {
		return fmt.Errorf("read example config: %w", err)
	}
	cfg := map[string]any{}
	if err := toml.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("parse %s: %w", contrib, err)
	}
	snapshotter, err := daemon.ProbeSnapshotter(s.dir)
	if err != nil {
		return err
	}
	hosts, sock := s.path("certs.d"), s.path("containerd.sock")
	cfg["root"], cfg["state"] = s.path("root"), s.path("state")
	set(cfg, sock, "plugins", "io.containerd.server.v1.grpc", "address")
	set(cfg, sock+".ttrpc", "plugins", "io.containerd.server.v1.ttrpc", "address")
	set(cfg, "", "plugins", "io.containerd.server.v1.metrics", "address")
	set(cfg, s.maxPulls, "plugins", "io.containerd.grpc.v1.pullwise", "max_parallel_image_pulls")
	set(cfg, snapshotter, "plugins", "io.containerd.cri.v1.images", "snapshotter")
	set(cfg, hosts, "plugins", "io.containerd.cri.v1.images", "registry", "config_path")
	set(cfg, hosts, "plugins", "io.containerd.transfer.v1.local", "config_path")
	set(cfg, []map[string]any{{"platform": platforms.Format(platforms.DefaultSpec()), "snapshotter": snapshotter}},
		"plugins", "io.containerd.transfer.v1.local", "unpack_config")
	set(cfg, s.path("opt"), "plugins", "io.containerd.internal.v1.opt", "path")
	// NRI would listen on a socket under /var/run, outside dir; the demo
	// runs no containers.
	set(cfg, true, "plugins", "io.containerd.nri.v1.nri", "disable")
	out, err := toml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return os.WriteFile(s.path("config.toml"), out, 0o600)
}

// set puts v at the path of keys in cfg, making tables on the way.
func set(cfg map[string]any, v any, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		next, ok := cfg[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cfg[k] = next
		}
		cfg = next
	}
	cfg[keys[len(keys)-1]] = v
}

// startContainerd runs bin/containerd on dir/config.toml and waits until
// the Pullwise API answers.
func (s *stack) startContainerd(ctx context.Context) error {
	log, err := os.Create(s.path("containerd.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	s.containerd = exec.Command(filepath.Join(s.bin, "containerd"), "--config", s.path("config.toml"), "--log-level", "info")
	s.containerd.Stdout, s.containerd.Stderr = log, log
	// Its own process group, so a ^C on the terminal reaches the demo
	// only, which then stops containerd in order; killed if the demo dies.
	s.containerd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.containerd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { _ = s.containerd.Wait(); close(s.exited) }()

	if s.conn, err = grpc.NewClient("unix://"+s.path("containerd.sock"), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return err
	}
	s.api = api.NewPullwiseClient(s.conn)
	ready, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		call, callCancel := context.WithTimeout(ready, time.Second)
		_, err := s.api.Version(call, &api.VersionRequest{})
		callCancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("containerd exited at start (%v): see %s", s.containerd.ProcessState, s.path("containerd.log"))
		case <-ready.Done():
			return fmt.Errorf("containerd not ready: %w (last error: %v)", ready.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop stops whatever started, in reverse order: containerd (SIGTERM,
// SIGKILL after 20s), the fronts, the registries; then unmounts what
// containerd left under dir and removes the scratch directories.
func (s *stack) stop() error {
	var errs []error
	if s.conn != nil {
		_ = s.conn.Close()
	}
	if s.containerd != nil && s.containerd.Process != nil {
		_ = s.containerd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			errs = append(errs, errors.New("containerd ignored SIGTERM for 20s; killed it"))
			_ = syscall.Kill(-s.containerd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	for _, f := range []*registry.Front{s.upstream, s.mirror} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	for _, r := range []*registry.Registry{s.mirrorReg, s.upstreamReg} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	if err := daemon.Unmount(s.dir); err != nil {
		// Removing files under a mount that stayed would reach into it.
		return errors.Join(append(errs, err)...)
	}
	for _, p := range s.scratch() {
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}
