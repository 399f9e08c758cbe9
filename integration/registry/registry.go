package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // registers the "filesystem" driver
	"github.com/sirupsen/logrus"
)

// Options configures a registry started by Start.
type Options struct {
	// Name labels the registry in test logs and failure messages, e.g.
	// "upstream" or "mirror". Defaults to "registry".
	Name string
	// ProxyRemoteURL, when set, makes the registry a pull-through cache of
	// that upstream (e.g. another Registry's URL()).
	ProxyRemoteURL string
	// DisableKeepAlives closes every connection after its response, so
	// clients keep no idle connections (and goroutines) to the registry.
	DisableKeepAlives bool
	// HeaderTimeout bounds the wait for a request's headers (30s when
	// zero). A client that gives up on a request while it dials may keep
	// the new connection idle without sending anything; a short timeout
	// closes those too.
	HeaderTimeout time.Duration
	// RedirectBlobs makes the registry answer blob GETs with a redirect to
	// a second server, its CDN.
	RedirectBlobs bool
}

// Registry is a CNCF Distribution registry listening on loopback. Every
// request passes through a recorder that also injects faults.
type Registry struct {
	name     string
	host     string
	app      *handlers.App
	recorder *recorder
	faults   atomic.Pointer[FaultFunc]
	cdn      *CDN // nil unless Options.RedirectBlobs
	server   *server
	close    func() error
}

// shutdownGrace bounds how long cleanup waits for in-flight requests before
// cutting connections; tests that stall requests on purpose should not make
// cleanup hang.
const shutdownGrace = 5 * time.Second

var quietOnce sync.Once

// quietLogs silences distribution's logging, which would otherwise print
// every request and every routine 404 of a push. handlers.NewApp ignores
// config.Log and logs through logrus' standard logger, so the only lever is
// that process-wide logger. REGISTRY_LOG_LEVEL (e.g. "debug") brings the
// logs back when debugging.
func quietLogs() {
	quietOnce.Do(func() {
		level, err := logrus.ParseLevel(os.Getenv("REGISTRY_LOG_LEVEL"))
		if err != nil {
			level = logrus.FatalLevel
		}
		logrus.SetLevel(level)
	})
}

// Start runs a registry with filesystem storage in t.TempDir() on
// 127.0.0.1 and stops it when the test ends.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	r, err := New(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// New runs a registry with filesystem storage in root on 127.0.0.1 until
// Close, for programs outside tests (the demo).
func New(root string, opts Options) (*Registry, error) {
	if opts.Name == "" {
		opts.Name = "registry"
	}
	quietLogs()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("registry %s: listen: %w", opts.Name, err)
	}

	cfg := newConfig(root, opts)
	var cdn *CDN
	if opts.RedirectBlobs {
		if cdn, err = startCDN(root); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("registry %s: %w", opts.Name, err)
		}
		cfg.Middleware = cdn.redirectTo()
	}
	ctx, cancel := context.WithCancel(context.Background())
	app, err := newApp(ctx, cfg)
	if err != nil {
		cancel()
		_ = ln.Close()
		if cdn != nil {
			_ = cdn.stop()
		}
		return nil, fmt.Errorf("registry %s: %w", opts.Name, err)
	}

	r := &Registry{
		name:     opts.Name,
		host:     ln.Addr().String(),
		app:      app,
		recorder: newRecorder(),
		cdn:      cdn,
	}
	if opts.HeaderTimeout == 0 {
		opts.HeaderTimeout = 30 * time.Second
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: opts.HeaderTimeout}
	srv.SetKeepAlivesEnabled(!opts.DisableKeepAlives)
	r.server = serve(ln, srv)
	r.close = func() error {
		defer cancel()
		if err := r.stop(); err != nil {
			return fmt.Errorf("registry %s: %w", r.name, err)
		}
		return nil
	}
	return r, nil
}

// Close stops the registry: it drains requests (cutting them after a
// grace period) and shuts the app down. Call it once.
func (r *Registry) Close() error { return r.close() }

// newApp turns NewApp's configuration panics into errors.
func newApp(ctx context.Context, cfg *configuration.Configuration) (app *handlers.App, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("create distribution app: %v", p)
		}
	}()
	return handlers.NewApp(ctx, cfg), nil
}

func newConfig(root string, opts Options) *configuration.Configuration {
	cfg := &configuration.Configuration{
		Storage: configuration.Storage{
			"filesystem": configuration.Parameters{"rootdirectory": root},
			"delete":     configuration.Parameters{"enabled": true},
			// The purger is a goroutine per app that would outlive the test.
			"maintenance": configuration.Parameters{
				"uploadpurging": map[any]any{"enabled": false},
			},
		},
	}
	cfg.HTTP.Secret = "integration-test-secret"
	if opts.ProxyRemoteURL != "" {
		// A zero TTL disables the expiry scheduler and its state-saving
		// goroutine; cached content never needs to expire within a test.
		noTTL := time.Duration(0)
		cfg.Proxy = configuration.Proxy{RemoteURL: opts.ProxyRemoteURL, TTL: &noTTL}
	}
	return cfg
}

// stop drains the server, then waits for handlers (which may still touch
// storage) before the app and its temp dir go away; the CDN, if any, last.
func (r *Registry) stop() error {
	errs := []error{shutdown(r.server, r.recorder)}
	if err := r.app.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("shut down app: %w", err))
	}
	if r.cdn != nil {
		if err := r.cdn.stop(); err != nil {
			errs = append(errs, fmt.Errorf("cdn: %w", err))
		}
	}
	return errors.Join(errs...)
}

// shutdown drains s, cutting connections after a grace period, and waits
// until rc has no request in flight.
func shutdown(s *server, rc *recorder) error {
	var errs []error
	if err := s.drain(); err != nil {
		errs = append(errs, fmt.Errorf("serve: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := rc.waitIdle(ctx); err != nil {
		errs = append(errs, fmt.Errorf("wait for in-flight requests: %w", err))
	}
	return errors.Join(errs...)
}

// CDN returns where blob GETs are redirected to; nil unless
// Options.RedirectBlobs.
func (r *Registry) CDN() *CDN { return r.cdn }

// Name returns Options.Name.
func (r *Registry) Name() string { return r.name }

// Host returns "127.0.0.1:PORT", the form used in image references.
func (r *Registry) Host() string { return r.host }

// URL returns "http://127.0.0.1:PORT".
func (r *Registry) URL() string { return "http://" + r.host }
