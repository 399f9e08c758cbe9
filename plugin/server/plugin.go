// Package server registers containerd's gRPC servers (ServerPlugins "grpc"
// and "grpc-tcp") and their metrics plugins in place of upstream's
// plugins/server/grpc. IDs, config keys and behaviour stay the same; the
// difference is that plugins of type interceptor.Plugin add interceptors.
package server

import (
	"fmt"
	"os"

	"github.com/containerd/errdefs"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/plugin/interceptor"
)

type config struct {
	Address        string `toml:"address"`
	UID            int    `toml:"uid"`
	GID            int    `toml:"gid"`
	MaxRecvMsgSize int    `toml:"max_recv_message_size"`
	MaxSendMsgSize int    `toml:"max_send_message_size"`
}

type tcpConfig struct {
	Address        string `toml:"address"`
	TLSCA          string `toml:"tls_ca"`
	TLSCert        string `toml:"tls_cert"`
	TLSKey         string `toml:"tls_key"`
	TLSCName       string `toml:"tls_common_name"`
	MaxRecvMsgSize int    `toml:"max_recv_message_size"`
	MaxSendMsgSize int    `toml:"max_send_message_size"`
}

// requires orders server init after every service and interceptor plugin.
var requires = []plugin.Type{plugins.GRPCPlugin, plugins.MetricsPlugin, interceptor.Plugin}

func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.ServerPlugin,
		ID:       "grpc",
		Requires: requires,
		Config: &config{
			Address:        defaults.DefaultAddress,
			UID:            os.Geteuid(),
			GID:            os.Getegid(),
			MaxRecvMsgSize: defaults.DefaultMaxRecvMsgSize,
			MaxSendMsgSize: defaults.DefaultMaxSendMsgSize,
		},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := ic.Config.(*config)
			if c.Address == "" {
				return nil, fmt.Errorf("grpc address cannot be empty: %w", errdefs.ErrInvalidArgument)
			}
			s, _, err := newServer(ic, c.MaxRecvMsgSize, c.MaxSendMsgSize, nil, registerLocal)
			if err != nil {
				return nil, err
			}
			return &localServer{Server: s, config: *c}, nil
		},
	})

	registry.Register(&plugin.Registration{
		Type:     plugins.ServerPlugin,
		ID:       "grpc-tcp",
		Requires: requires,
		Config: &tcpConfig{
			MaxRecvMsgSize: defaults.DefaultMaxRecvMsgSize,
			MaxSendMsgSize: defaults.DefaultMaxSendMsgSize,
		},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := ic.Config.(*tcpConfig)
			if c.Address == "" {
				return nil, plugin.ErrSkipPlugin
			}
			creds, err := tcpCredentials(ic.Context, c)
			if err != nil {
				return nil, err
			}
			s, registered, err := newServer(ic, c.MaxRecvMsgSize, c.MaxSendMsgSize, creds, registerTCP)
			if err != nil {
				return nil, err
			}
			if !registered {
				return nil, fmt.Errorf("no tcp grpc services configured: %w", plugin.ErrSkipPlugin)
			}
			return &tcpServer{Server: s, config: *c}, nil
		},
	})
}
