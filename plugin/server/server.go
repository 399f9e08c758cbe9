package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/containerd/containerd/v2/pkg/sys"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/plugin/interceptor"
)

// registerFunc registers one GRPCPlugin instance on a server. It reports
// whether the instance had a service for this kind of server.
type registerFunc func(instance any, s *grpc.Server) (bool, error)

func registerLocal(instance any, s *grpc.Server) (bool, error) {
	svc, ok := instance.(interface{ Register(*grpc.Server) error })
	if !ok {
		return false, nil
	}
	return true, svc.Register(s)
}

func registerTCP(instance any, s *grpc.Server) (bool, error) {
	svc, ok := instance.(interface{ RegisterTCP(*grpc.Server) error })
	if !ok {
		return false, nil
	}
	return true, svc.RegisterTCP(s)
}

// newServer builds a gRPC server with containerd's interceptors first (so
// ours see the namespace and are counted by prometheus), then the Pullwise
// interceptor chain, and registers every GRPCPlugin service that fits. It
// reports whether any service was registered.
func newServer(ic *plugin.InitContext, maxRecv, maxSend int, creds credentials.TransportCredentials, register registerFunc) (*grpc.Server, bool, error) {
	// Recovery comes first, so that a request that trips a bug anywhere
	// below fails alone instead of taking the daemon down. Upstream has no
	// such net: a malformed images Update request panics containerd.
	recover := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.G(ctx).WithField("panic", p).WithField("stack", string(debug.Stack())).Error("gRPC handler panicked")
		return status.Error(codes.Internal, "internal error: the request could not be served (the runtime's log has the details)")
	})
	unary := []grpc.UnaryServerInterceptor{recovery.UnaryServerInterceptor(recover), unaryNamespace}
	stream := []grpc.StreamServerInterceptor{recovery.StreamServerInterceptor(recover), streamNamespace}
	var opts []grpc.ServerOption

	var promMetrics *grpcprom.ServerMetrics
	if p, err := ic.GetByID(plugins.MetricsPlugin, "grpc-prometheus"); err == nil {
		promMetrics = p.(*grpcprom.ServerMetrics)
		unary = append(unary, promMetrics.UnaryServerInterceptor())
		stream = append(stream, promMetrics.StreamServerInterceptor())
	}
	if p, err := ic.GetByID(plugins.MetricsPlugin, "grpc-otel"); err == nil {
		opts = append(opts, grpc.StatsHandler(p.(stats.Handler)))
	}

	pwUnary, pwStream := interceptor.Collect(ic.Plugins())
	unary = append(unary, pwUnary...)
	stream = append(stream, pwStream...)
	opts = append(opts, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))

	if maxRecv > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(maxRecv))
	}
	if maxSend > 0 {
		opts = append(opts, grpc.MaxSendMsgSize(maxSend))
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}

	extra := &methods{handlers: map[string]grpc.StreamHandler{}}
	opts = append(opts, grpc.UnknownServiceHandler(extra.handle))

	s := grpc.NewServer(opts...)
	extra.server = s
	var (
		registered bool
		extras     []any
	)
	// Walk the whole set rather than GetByType, which stops at the first
	// plugin that failed to initialize (CRI fails when rootless, for one);
	// those were logged already and must not keep the server down.
	for _, p := range ic.Plugins().GetAll() {
		if p.Registration.Type != plugins.GRPCPlugin {
			continue
		}
		inst, err := p.Instance()
		if err != nil {
			continue
		}
		ok, err := register(inst, s)
		if err != nil {
			return nil, false, fmt.Errorf("register grpc service %s: %w", p.Registration.URI(), err)
		}
		registered = registered || ok
		if ok {
			extras = append(extras, inst)
		}
	}
	// Extra methods go in once every service is registered, so a method
	// its own service serves is recognised whatever the plugin order.
	for _, inst := range extras {
		if err := extra.add(inst); err != nil {
			return nil, false, err
		}
	}
	if promMetrics != nil {
		promMetrics.InitializeMetrics(s)
	}
	return s, registered, nil
}

func tcpCredentials(ctx context.Context, c *tcpConfig) (credentials.TransportCredentials, error) {
	if c.TLSCName != "" && c.TLSCert == "" {
		return nil, errors.New("tls_common_name selects a certificate from the Windows certificate store, which this platform does not have: set tls_cert and tls_key")
	}
	if c.TLSCert == "" {
		return nil, nil
	}
	log.G(ctx).Info("setting up tls on tcp GRPC services...")
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load tls key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("failed to load CA file: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(cfg), nil
}

type localServer struct {
	*grpc.Server
	config config
}

func (s *localServer) Start(ctx context.Context) error {
	log.G(ctx).WithFields(log.Fields{"address": s.config.Address, "uid": s.config.UID, "gid": s.config.GID}).Info("starting GRPC server")
	l, err := sys.GetLocalListener(s.config.Address, s.config.UID, s.config.GID)
	if err != nil {
		return fmt.Errorf("failed to get listener for main endpoint: %w", err)
	}
	serve(ctx, l, s.Serve)
	return nil
}

func (s *localServer) Close() error {
	s.Stop()
	return nil
}

type tcpServer struct {
	*grpc.Server
	config tcpConfig
}

func (s *tcpServer) Start(ctx context.Context) error {
	l, err := net.Listen("tcp", s.config.Address)
	if err != nil {
		return fmt.Errorf("failed to get listener for TCP grpc endpoint: %w", err)
	}
	serve(ctx, l, s.Serve)
	return nil
}

func (s *tcpServer) Close() error {
	s.Stop()
	return nil
}

// serve runs the server until Close. upstream's serve loop is internal to
// containerd, hence this one. A daemon whose API socket stopped serving is
// of no use, so an unexpected serve error ends the process, as upstream does.
func serve(ctx context.Context, l net.Listener, fn func(net.Listener) error) {
	addr := l.Addr().String()
	log.G(ctx).WithField("address", addr).Info("serving...")
	go func() {
		defer l.Close()
		if err := fn(l); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			log.G(ctx).WithError(err).WithField("address", addr).Fatal("serve failure")
		}
	}()
}
