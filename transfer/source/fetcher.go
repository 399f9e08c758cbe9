// Package source records which registry host served each pull. A pull
// source from CRI or ctr (registry.OCIRegistry) hides its resolver, so the
// source is rebuilt here from what it exposes about itself, with a host
// client per registry host (transfer/hostclient) that tells the pull's
// Recorder who answered. The recorder also learns, from the manifests and
// blobs read, when the pull has nothing left to fetch (fetched.go) and why
// a pull no host could serve failed (failure.go); Prefetch fetches a
// waiting pull's image manifest.
package source

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/hostclient"
	"github.com/pullwise/pullwise/transfer/lane"
)

// describer is a pull source that can describe itself and name its image,
// as registry.OCIRegistry does.
type describer interface {
	transfer.ImageFetcher
	Image() string
	MarshalAny(context.Context, streaming.StreamCreator) (typeurl.Any, error)
}

// Fetcher is a registry pull source that records who served it. It keeps
// the faces the local transfer service looks for: the download limiter
// arrives through SetResolverOptions.
type Fetcher struct {
	ref       string
	orig      describer
	resolver  remotes.Resolver
	rec       *Recorder
	creds     *Pipe      // nil without credentials
	downloads *lane.Lane // nil: containerd's download limiter applies

	mu         sync.Mutex
	prefetched map[digest.Digest][]byte // manifests Prefetch fetched, not yet served
}

// New rebuilds src as a recording Fetcher. nodeHosts is the node's way to
// registries: Dirs is where hosts.toml trees are looked up when the source
// names none (ctr's --hosts-dir can get lost on the way to the daemon), each
// entry possibly a list separated by ":", as CRI's config_path is; Health
// and Downloads are shared by every pull. ok is false when src is not a registry
// source that can be rebuilt; use src as it is then. ctx must last as long
// as the pull: the source serves its credentials until it ends or Close.
func New(ctx context.Context, src transfer.ImageFetcher, nodeHosts Hosts) (f *Fetcher, ok bool, err error) {
	d, isDescriber := src.(describer)
	if !isDescriber {
		return nil, false, nil
	}
	streams := &Streams{}
	a, err := d.MarshalAny(ctx, streams)
	if err != nil {
		return nil, false, fmt.Errorf("describe %s: %w", d.Image(), err)
	}
	var desc transfertypes.OCIRegistry
	if err := typeurl.UnmarshalTo(a, &desc); err != nil {
		// Not a registry source after all.
		return nil, false, nil
	}
	f = &Fetcher{ref: desc.Reference, orig: d, rec: &Recorder{}, creds: streams.Stream()}
	res := desc.GetResolver()

	dirs := nodeHosts.Dirs
	if res.GetHostDir() != "" {
		dirs = []string{res.GetHostDir()}
	}
	f.downloads = nodeHosts.Downloads
	hosts := Hosts{Dirs: dirs, DefaultScheme: res.GetDefaultScheme(), Headers: http.Header{},
		Health: nodeHosts.Health, Downloads: nodeHosts.Downloads, Link: nodeHosts.Link, Peers: nodeHosts.Peers, Arrivals: nodeHosts.Arrivals}
	if f.creds != nil {
		hosts.Credentials = credentialAsker(ctx, f.creds, desc.Reference)
	}
	for k, v := range res.GetHeaders() {
		hosts.Headers.Set(k, v)
	}
	f.resolver = NewResolver(ctx, hosts, f.rec)
	return f, true, nil
}

// Hosts is how to reach registries: hosts.toml roots, credentials, headers.
type Hosts struct {
	// Dirs are hosts.toml roots; each may be a ":"-separated list.
	Dirs          []string
	DefaultScheme string
	Credentials   func(host string) (user, secret string, err error)
	Headers       http.Header
	// Health is the node's memory of failing hosts, with the timeouts that
	// bound a stalled one; nil remembers and bounds nothing.
	Health *health.Table
	// Downloads, when set, bounds blob downloads node-wide, oldest pull
	// first (see transfer/lane).
	Downloads *lane.Lane
	// Link, with Downloads, pauses the bodies of pulls that would finish
	// well after others downloading (lane.Link).
	Link *lane.Link
	// Peers, when set, is the node's peers (transfer/peers), asked for
	// every blob before the registry's hosts; Arrivals, where the blob
	// bytes read from those hosts go for the peers to follow.
	Peers    http.RoundTripper
	Arrivals hostclient.Arrivals
}

// node is what every pull on the node shares, for the host clients.
func (h Hosts) node() hostclient.Node {
	return hostclient.Node{Health: h.Health, Downloads: h.Downloads, Link: h.Link, Arrivals: h.Arrivals}
}

// NewResolver returns containerd's registry resolver for hosts, with every
// registry host's client recording through rec.
//
// The resolver is one pull's (or one digest check's), and it configures
// each registry host once: containerd's ConfigureHosts makes a new
// authorizer, with an empty token cache, every time it is asked, and a
// pull asks for its resolve, for a waiting pull's prefetch and for the
// fetch. Configured once, they share one bearer token per scope, as long
// as it is valid, where each would fetch its own and be answered 401
// first.
func NewResolver(ctx context.Context, h Hosts, rec *Recorder) remotes.Resolver {
	hosts := config.ConfigureHosts(ctx, config.HostOptions{
		HostDir:       hostDirFunc(h.Dirs),
		Credentials:   h.Credentials,
		DefaultScheme: h.DefaultScheme,
	})
	var (
		mu         sync.Mutex
		configured = map[string][]docker.RegistryHost{}
	)
	return docker.NewResolver(docker.ResolverOptions{
		Hosts: func(host string) ([]docker.RegistryHost, error) {
			mu.Lock()
			defer mu.Unlock()
			if hs, ok := configured[host]; ok {
				return hs, nil
			}
			hs, err := hosts(host)
			if err != nil {
				return nil, err
			}
			keys := make([]health.Key, len(hs))
			for i, h := range hs {
				keys[i] = health.Key{Scheme: h.Scheme, Host: h.Host, Path: h.Path}
			}
			for i := range hs {
				ep := hostclient.Endpoint{Key: keys[i], Role: hostclient.RoleMirror, Later: keys[i+1:]}
				if i == len(hs)-1 {
					ep.Role = hostclient.RoleUpstream
				}
				hs[i].Client = hostclient.Wrap(hs[i].Client, h.node(), ep, rec.observer())
				if hs[i].Authorizer != nil {
					hs[i].Authorizer = hostclient.Renewing(hs[i].Authorizer, func() docker.Authorizer {
						if again, err := hosts(host); err == nil && len(again) == len(hs) {
							return again[i].Authorizer
						}
						return nil
					})
				}
			}
			// hs stays the registry's hosts alone: renew counts them.
			all := withPeers(hs, h.Peers, keys, rec)
			configured[host] = all
			return all, nil
		},
		Headers: h.Headers,
	})
}

// withPeers puts the node's peers, when on, before the registry's hosts,
// for blobs only (HostCapabilityPull without Resolve: tags and manifests
// never come from a peer, and its transport answers 404 to any manifest).
// It takes no download place and no health or link from the node: a
// blob from a peer is not the registry's link, and the peers bound their
// own waits (peers.Config).
func withPeers(hs []docker.RegistryHost, peers http.RoundTripper, later []health.Key, rec *Recorder) []docker.RegistryHost {
	if peers == nil || len(hs) == 0 {
		return hs
	}
	ep := hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: peersHost, Path: "/v2"}, Role: hostclient.RolePeer, Later: later}
	p := docker.RegistryHost{
		Client:       hostclient.Wrap(&http.Client{Transport: peers}, hostclient.Node{}, ep, rec.observer()),
		Host:         peersHost,
		Scheme:       "http",
		Path:         "/v2",
		Capabilities: docker.HostCapabilityPull,
	}
	return append([]docker.RegistryHost{p}, hs...)
}

// peersHost names the peers in request URLs; nothing dials it, as the
// peers' transport answers every request itself.
const peersHost = "peers.pullwise.invalid"

// hostDirFunc looks a registry host up in each config_path root in turn.
// CRI's default is the list "/etc/containerd/certs.d:/etc/docker/certs.d",
// which upstream treats as one directory (containerd#12808).
func hostDirFunc(dirs []string) func(string) (string, error) {
	var roots []string
	for _, d := range dirs {
		for _, r := range filepath.SplitList(d) {
			if r != "" {
				roots = append(roots, r)
			}
		}
	}
	return func(host string) (string, error) {
		for _, r := range roots {
			dir, err := config.HostDirFromRoot(r)(host)
			if err == nil {
				return dir, nil
			}
			if !errors.Is(err, errdefs.ErrNotFound) && !os.IsNotExist(err) {
				return "", err
			}
		}
		return "", errdefs.ErrNotFound
	}
}

// credentialAsker asks the source's credentials stream, one question at a
// time, as the source's own resolver would.
func credentialAsker(ctx context.Context, p *Pipe, ref string) func(host string) (string, string, error) {
	var mu sync.Mutex
	return func(host string) (string, string, error) {
		mu.Lock()
		defer mu.Unlock()
		req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: host, Reference: ref})
		if err != nil {
			return "", "", err
		}
		a, err := p.Ask(ctx, req)
		if err != nil {
			return "", "", fmt.Errorf("ask credentials for %s: %w", host, err)
		}
		var resp transfertypes.AuthResponse
		if err := typeurl.UnmarshalTo(a, &resp); err != nil {
			return "", "", fmt.Errorf("decode credentials for %s: %w", host, err)
		}
		switch resp.GetAuthType() {
		case transfertypes.AuthType_CREDENTIALS:
			return resp.GetUsername(), resp.GetSecret(), nil
		case transfertypes.AuthType_REFRESH:
			return "", resp.GetSecret(), nil
		}
		// Header auth has no place in host credentials; the registry
		// answers with its challenge, as it would upstream.
		return "", "", nil
	}
}

// Close stops serving the source's credentials.
func (f *Fetcher) Close() error {
	if f.creds != nil {
		return f.creds.Close()
	}
	return nil
}

// OnBlobBytes reports blob bytes as they are read; see Recorder.
func (f *Fetcher) OnBlobBytes(fn func(dgst string, n int64)) { f.rec.OnBlobBytes(fn) }

// OnFetched reports when the pull has every blob; see Recorder.OnFetched.
func (f *Fetcher) OnFetched(present func(digest.Digest) bool, done func()) {
	f.rec.OnFetched(present, done)
}

// OnUnpacked tells the pull which layers it will not fetch; see
// Recorder.OnUnpacked.
func (f *Fetcher) OnUnpacked(fn Unpacked) {
	f.rec.OnUnpacked(fn)
}

// MountedLazily notes a layer a remote snapshotter mounted; see
// Recorder.MountedLazily.
func (f *Fetcher) MountedLazily(d digest.Digest) int64 { return f.rec.MountedLazily(d) }

// OnSize reports the layers the pull has left to fetch; see Recorder.OnSize.
func (f *Fetcher) OnSize(fn func(layers []ocispec.Descriptor)) { f.rec.OnSize(fn) }

// OnBlobs reports the blobs the pull will fetch; see Recorder.OnBlobs.
func (f *Fetcher) OnBlobs(fn func(blobs []ocispec.Descriptor)) { f.rec.OnBlobs(fn) }

// Result says where the pull came from, for the reference it asked for.
func (f *Fetcher) Result() Result {
	return f.rec.Result(reference(f.ref))
}

// Failure explains a failed pull by what every host answered, or is nil
// when the registries are not what failed it; see Recorder.Failure.
func (f *Fetcher) Failure() error { return f.rec.Failure(f.ref) }

// reference is the tag or digest part of ref.
func reference(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[i+1:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return "latest"
}

// Image implements the image naming registry sources have.
func (f *Fetcher) Image() string { return f.ref }

func (f *Fetcher) String() string { return fmt.Sprint(f.orig) }

// Resolve implements transfer.ImageResolver.
func (f *Fetcher) Resolve(ctx context.Context) (string, ocispec.Descriptor, error) {
	return f.resolver.Resolve(ctx, f.ref)
}

// Fetcher implements transfer.ImageFetcher.
func (f *Fetcher) Fetcher(ctx context.Context, ref string) (transfer.Fetcher, error) {
	next, err := f.resolver.Fetcher(ctx, ref)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.prefetched) == 0 {
		return next, nil
	}
	return prefetchedFetcher{Fetcher: next, f: f}, nil
}

// SetResolverOptions implements transfer.ImageResolverOptionSetter.
// With a download lane, containerd's own download limiter is left out: the
// lane takes its place, with the same limit, oldest pull first.
func (f *Fetcher) SetResolverOptions(opts ...transfer.ImageResolverOption) {
	r, ok := f.resolver.(remotes.ResolverWithOptions)
	if !ok {
		return
	}
	if f.downloads == nil {
		r.SetOptions(opts...)
		return
	}
	var o transfer.ImageResolverOptions
	for _, opt := range opts {
		opt(&o)
	}
	r.SetOptions(
		transfer.WithMaxConcurrentDownloads(o.Performances.MaxConcurrentDownloads),
		transfer.WithConcurrentLayerFetchBuffer(o.Performances.ConcurrentLayerFetchBuffer),
	)
}

// MarshalAny describes the original source.
func (f *Fetcher) MarshalAny(ctx context.Context, sm streaming.StreamCreator) (typeurl.Any, error) {
	return f.orig.MarshalAny(ctx, sm)
}
