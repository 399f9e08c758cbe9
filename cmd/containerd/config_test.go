package main

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/sirupsen/logrus"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/containerd/containerd/v2/version"
)

// TestContribConfigKeysAreKnown loads contrib/config.toml as this containerd
// does and decodes each plugin's table into that plugin's config. containerd
// starts anyway when a key is in the wrong table, and only warns: the
// setting is silently lost. So a key the example puts where its plugin does
// not read it would mislead every operator who copies it.
func TestContribConfigKeysAreKnown(t *testing.T) {
	var out bytes.Buffer
	logger := logrus.New()
	logger.Out = &out
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))

	cfg := srvconfig.Config{Version: version.ConfigVersion}
	if err := srvconfig.LoadConfig(ctx, "../../contrib/config.toml", &cfg); err != nil {
		t.Fatalf("load contrib/config.toml: %v", err)
	}
	regs := registry.Graph(func(*plugin.Registration) bool { return false })
	for id := range cfg.Plugins {
		i := slices.IndexFunc(regs, func(r plugin.Registration) bool { return r.URI() == id })
		if i < 0 {
			t.Errorf("contrib/config.toml configures %q, which this containerd does not have", id)
			continue
		}
		if regs[i].Config == nil {
			t.Errorf("contrib/config.toml configures %q, which takes no configuration", id)
			continue
		}
		fresh := reflect.New(reflect.TypeOf(regs[i].Config).Elem()).Interface()
		if _, err := cfg.Decode(ctx, id, fresh); err != nil {
			t.Errorf("decode %s: %v", id, err)
		}
	}
	for line := range strings.Lines(out.String()) {
		if strings.Contains(line, "unknown key") {
			t.Errorf("contrib/config.toml: %s", line)
		}
	}
	if len(cfg.Plugins) == 0 {
		t.Fatal("contrib/config.toml configures no plugin")
	}
}
