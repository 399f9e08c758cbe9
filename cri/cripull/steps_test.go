package cripull

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/containerd/v2/core/transfer/registry"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/internal/metadatatest"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

// TestLabels: every image CRI pulls is managed; pinned only when
// pinned_images names it exactly (under any key), as upstream compares:
// the pulled reference is normalized, pinned_images is not.
func TestLabels(t *testing.T) {
	pause := "registry.k8s.io/pause:3.10"
	byDigest := "registry.example/agent@" + digest.FromString("agent").String()
	managed := map[string]string{managedLabel: managedValue}
	pinned := map[string]string{managedLabel: managedValue, pinnedLabel: pinnedValue}
	for _, tc := range []struct {
		name string
		pins map[string]string
		ref  string
		want map[string]string
	}{
		{name: "no pinned images", ref: pause, want: managed},
		{name: "the sandbox image", pins: map[string]string{"sandbox": pause}, ref: pause, want: pinned},
		{name: "another tag of the sandbox image", pins: map[string]string{"sandbox": pause}, ref: "registry.k8s.io/pause:3.9", want: managed},
		{name: "an image pinned under another key", pins: map[string]string{"sandbox": pause, "agent": byDigest}, ref: byDigest, want: pinned},
		{name: "an image nothing pins", pins: map[string]string{"sandbox": pause}, ref: "docker.io/library/busybox:latest", want: managed},
		{name: "a short name in pinned_images pins nothing", pins: map[string]string{"sandbox": "busybox:1.36"}, ref: "docker.io/library/busybox:1.36", want: managed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Puller{deps: Deps{Config: criconfig.Images{PinnedImages: tc.pins}}}
			if got := p.labels(tc.ref); !maps.Equal(got, tc.want) {
				t.Errorf("labels(%s) = %v, want %v", tc.ref, got, tc.want)
			}
		})
	}
}

// criStore is containerd's metadata image store on a bolt database in a
// temporary directory, in CRI's namespace.
func criStore(t *testing.T) (images.Store, context.Context) {
	t.Helper()
	return metadata.NewImageStore(metadatatest.DB(t)), namespaces.WithNamespace(context.Background(), criconfig.Namespace)
}

// TestCreateOrUpdate: a CRI image record is created with CRI's labels, or
// pointed at the new target with the managed and pinned labels set, and
// every other label (the pull source) left as it was. A pin is never
// taken away by a pull of an image no longer pinned, and a record that
// already says it all is not written again.
func TestCreateOrUpdate(t *testing.T) {
	oldTarget := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("old"), Size: 10}
	newTarget := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("new"), Size: 10}
	managed := map[string]string{managedLabel: managedValue}
	pinned := map[string]string{managedLabel: managedValue, pinnedLabel: pinnedValue}
	source := map[string]string{"io.pullwise.pull-source": "mirror.example/app:v1"}
	with := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			maps.Copy(out, m)
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		existing   *images.Image
		target     ocispec.Descriptor
		labels     map[string]string
		wantLabels map[string]string
		// wantWrite: the existing record is written again (its
		// UpdatedAt moves).
		wantWrite bool
	}{
		{name: "new image", target: newTarget, labels: managed, wantLabels: managed},
		{name: "new pinned image", target: newTarget, labels: pinned, wantLabels: pinned},
		{name: "new target keeps the pull source", existing: &images.Image{Target: oldTarget, Labels: with(managed, source)},
			target: newTarget, labels: managed, wantLabels: with(managed, source), wantWrite: true},
		{name: "an unmanaged record becomes managed", existing: &images.Image{Target: oldTarget, Labels: source},
			target: oldTarget, labels: managed, wantLabels: with(managed, source), wantWrite: true},
		{name: "a foreign managed value is replaced", existing: &images.Image{Target: oldTarget, Labels: map[string]string{managedLabel: "other"}},
			target: oldTarget, labels: managed, wantLabels: managed, wantWrite: true},
		{name: "pinned on its pull", existing: &images.Image{Target: oldTarget, Labels: with(managed, source)},
			target: oldTarget, labels: pinned, wantLabels: with(pinned, source), wantWrite: true},
		{name: "a foreign pinned value is replaced on a pinned pull", existing: &images.Image{Target: oldTarget, Labels: with(managed, map[string]string{pinnedLabel: "no"})},
			target: oldTarget, labels: pinned, wantLabels: pinned, wantWrite: true},
		{name: "a pin stays on a new target", existing: &images.Image{Target: oldTarget, Labels: pinned},
			target: newTarget, labels: managed, wantLabels: pinned, wantWrite: true},
		{name: "a pin stays on the same target, untouched", existing: &images.Image{Target: oldTarget, Labels: pinned},
			target: oldTarget, labels: managed, wantLabels: pinned},
		{name: "same target and labels, untouched", existing: &images.Image{Target: oldTarget, Labels: with(managed, source)},
			target: oldTarget, labels: managed, wantLabels: with(managed, source)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, ctx := criStore(t)
			const name = "registry.example/app:v1"
			var before images.Image
			if tc.existing != nil {
				tc.existing.Name = name
				var err error
				if before, err = store.Create(ctx, *tc.existing); err != nil {
					t.Fatal(err)
				}
			}
			p := &Puller{deps: Deps{Images: store}}
			if err := p.createOrUpdate(ctx, name, tc.target, tc.labels); err != nil {
				t.Fatal(err)
			}
			got, err := store.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Target.Digest != tc.target.Digest || !maps.Equal(got.Labels, tc.wantLabels) {
				t.Fatalf("record: target %s, labels %v; want %s, %v", got.Target.Digest, got.Labels, tc.target.Digest, tc.wantLabels)
			}
			if tc.existing == nil {
				return
			}
			if wrote := !got.UpdatedAt.Equal(before.UpdatedAt); wrote != tc.wantWrite {
				t.Errorf("record written again: %v, want %v", wrote, tc.wantWrite)
			}
		})
	}
}

// racingStore is an image store where another client removes the record
// right after the step removeAfter names ("create" or "get"), the race
// upstream's createOrUpdateImageReference notes.
type racingStore struct {
	images.Store
	removeAfter string
	// appears: another writer makes the record just after a Get finds
	// none.
	appears *images.Image
}

func (s racingStore) Create(ctx context.Context, img images.Image) (images.Image, error) {
	got, err := s.Store.Create(ctx, img)
	s.remove(ctx, "create", img.Name)
	return got, err
}

func (s racingStore) Get(ctx context.Context, name string) (images.Image, error) {
	got, err := s.Store.Get(ctx, name)
	if errdefs.IsNotFound(err) && s.appears != nil {
		_, _ = s.Store.Create(ctx, *s.appears)
	}
	s.remove(ctx, "get", name)
	return got, err
}

func (s racingStore) remove(ctx context.Context, step, name string) {
	if s.removeAfter == step {
		// The record may be gone already; either way it is now.
		_ = s.Store.Delete(ctx, name)
	}
}

// TestCreateOrUpdateErrors: what the image store refuses comes back with
// its errdefs code, which PullImage's caller sees as the gRPC code.
func TestCreateOrUpdateErrors(t *testing.T) {
	const name = "registry.example/app:v1"
	target := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("t"), Size: 10}
	managed := map[string]string{managedLabel: managedValue}
	for _, tc := range []struct {
		name        string
		existing    bool
		appears     bool
		removeAfter string
		target      ocispec.Descriptor
		wantIs      error
	}{
		{name: "a target without a media type", target: ocispec.Descriptor{Digest: target.Digest, Size: 10}, wantIs: errdefs.ErrInvalidArgument},
		{name: "a target without a digest", existing: true, target: ocispec.Descriptor{MediaType: target.MediaType, Size: 10}, wantIs: errdefs.ErrInvalidArgument},
		{name: "made and removed by others between get and create", appears: true, removeAfter: "create", target: target, wantIs: errdefs.ErrNotFound},
		{name: "removed between get and update", existing: true, removeAfter: "get", target: target, wantIs: errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, ctx := criStore(t)
			if tc.existing {
				old := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("old"), Size: 10}
				if _, err := store.Create(ctx, images.Image{Name: name, Target: old}); err != nil {
					t.Fatal(err)
				}
			}
			racing := racingStore{Store: store, removeAfter: tc.removeAfter}
			if tc.appears {
				racing.appears = &images.Image{Name: name, Target: target}
			}
			p := &Puller{deps: Deps{Images: racing}}
			err := p.createOrUpdate(ctx, name, tc.target, managed)
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("createOrUpdate: %v, want %v", err, tc.wantIs)
			}
		})
	}
}

// fakeTransfer stands in for the transfer service. It does the two steps
// of a pull that decide what CRI sees, and leaves out fetching and
// unpacking: it resolves the image through the source when resolve is
// set (else takes target), and stores the image's record through the
// destination into images, as the service does once it has unpacked.
// It remembers what it was asked.
type fakeTransfer struct {
	images  images.Store // nil: the pull stores no record
	target  ocispec.Descriptor
	resolve bool
	err     error // returned without storing
	hang    bool  // waits for the pull's context to end

	// source, if set, are the pull-source labels the transfer service
	// sets on the records it stored, as Pullwise's does.
	source map[string]string

	asks     int
	src, dst any
	progress bool
	stored   []images.Image
}

func (f *fakeTransfer) Transfer(ctx context.Context, src, dst any, opts ...transfer.Opt) error {
	f.asks++
	f.src, f.dst = src, dst
	var cfg transfer.Config
	for _, o := range opts {
		o(&cfg)
	}
	f.progress = cfg.Progress != nil
	switch {
	case f.hang:
		<-ctx.Done()
		return ctx.Err()
	case f.err != nil:
		return f.err
	case f.images == nil:
		return nil
	}
	target := f.target
	if f.resolve {
		var err error
		if _, target, err = src.(transfer.ImageResolver).Resolve(ctx); err != nil {
			return err
		}
	}
	var err error
	if f.stored, err = dst.(transfer.ImageStorer).Store(ctx, target, f.images); err != nil {
		return err
	}
	for _, rec := range f.stored {
		if len(f.source) > 0 {
			if err := sourcelabel.Set(ctx, f.images, rec, f.source); err != nil {
				return err
			}
		}
	}
	return nil
}

// criCache is CRI's image cache: it remembers which names it was told to
// read again.
type criCache struct {
	err     error
	updated []string
}

func (c *criCache) UpdateImage(_ context.Context, ref string) error {
	c.updated = append(c.updated, ref)
	return c.err
}

// pulledImage is an image in a content store, as a pull leaves it.
type pulledImage struct {
	cs       content.Store
	manifest ocispec.Descriptor
	config   ocispec.Descriptor
}

func newPulledImage(t *testing.T) pulledImage {
	t.Helper()
	cs := newContentStore(t)
	manifest, config, _ := writeImage(t, cs, platforms.DefaultSpec(), "pulled")
	return pulledImage{cs: cs, manifest: manifest, config: config}
}

// puller is a Puller on containerd's metadata image store, with ft as
// its transfer service (storing there) and cri as CRI's cache (nil: CRI
// unavailable, with criErr).
func (img pulledImage) puller(t *testing.T, cfg criconfig.Images, ft *fakeTransfer, cri *criCache, criErr error) (*Puller, images.Store, context.Context) {
	t.Helper()
	store, ctx := criStore(t)
	ft.images, ft.target = store, img.manifest
	p, err := New(Deps{
		Transfer: ft,
		Images:   store,
		Content:  img.cs,
		CRI: func() (CRIImages, error) {
			if cri == nil {
				return nil, criErr
			}
			return cri, nil
		},
		Config: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, store, ctx
}

// TestPullRecords: a pull answers CRI's image ID (the config digest) and
// leaves the records CRI's would, under the ID, the repo tag and the repo
// digest, each with CRI's labels and told to CRI's cache in that order;
// it asks the transfer service for the node's platform, unpacked into
// CRI's snapshotter, with CRI's local path options.
func TestPullRecords(t *testing.T) {
	img := newPulledImage(t)
	m := img.manifest.Digest.String()
	managed := map[string]string{managedLabel: managedValue}
	pinned := map[string]string{managedLabel: managedValue, pinnedLabel: pinnedValue}
	for _, tc := range []struct {
		name          string
		image         string
		handler       string
		sandbox       *runtime.PodSandboxConfig
		config        criconfig.Images // Snapshotter is overlayfs
		wantRef       string
		wantTag       string
		wantDigest    string
		wantLabels    map[string]string
		wantUnpackTo  string
		wantDiscard   bool
		noAnnotations bool
		source        map[string]string // set by the transfer service on what it stored
	}{
		{name: "tagged", image: "registry.example/app:v1",
			wantRef: "registry.example/app:v1", wantTag: "registry.example/app:v1", wantDigest: "registry.example/app@" + m,
			wantLabels: managed, wantUnpackTo: "overlayfs"},
		{name: "docker.io short name", image: "busybox",
			wantRef: "docker.io/library/busybox:latest", wantTag: "docker.io/library/busybox:latest", wantDigest: "docker.io/library/busybox@" + m,
			wantLabels: managed, wantUnpackTo: "overlayfs"},
		{name: "by digest", image: "registry.example/app@" + m,
			wantRef: "registry.example/app@" + m, wantDigest: "registry.example/app@" + m,
			wantLabels: managed, wantUnpackTo: "overlayfs"},
		{name: "the pinned sandbox image", image: "registry.k8s.io/pause:3.10",
			config:  criconfig.Images{PinnedImages: map[string]string{"sandbox": "registry.k8s.io/pause:3.10"}},
			wantRef: "registry.k8s.io/pause:3.10", wantTag: "registry.k8s.io/pause:3.10", wantDigest: "registry.k8s.io/pause@" + m,
			wantLabels: pinned, wantUnpackTo: "overlayfs"},
		{name: "the runtime handler's snapshotter", image: "registry.example/app:v1", handler: "lazy", sandbox: &runtime.PodSandboxConfig{},
			config:  criconfig.Images{RuntimePlatforms: map[string]criconfig.ImagePlatform{"lazy": {Snapshotter: "stargz"}}},
			wantRef: "registry.example/app:v1", wantTag: "registry.example/app:v1", wantDigest: "registry.example/app@" + m,
			wantLabels: managed, wantUnpackTo: "stargz"},
		{name: "discarded layers, no snapshot annotations", image: "registry.example/app:v1",
			config:  criconfig.Images{DiscardUnpackedLayers: true, DisableSnapshotAnnotations: true},
			wantRef: "registry.example/app:v1", wantTag: "registry.example/app:v1", wantDigest: "registry.example/app@" + m,
			wantLabels: managed, wantUnpackTo: "overlayfs", wantDiscard: true, noAnnotations: true},
		// The records made after the transfer carry its pull source from
		// their first write, not in a second one each.
		{name: "with the pull source", image: "registry.example/app:v1",
			source:  map[string]string{sourcelabel.PullSource: "mirror.example/app:v1", sourcelabel.BlobSources: `{"mirror.example":{"blobs":3}}`},
			wantRef: "registry.example/app:v1", wantTag: "registry.example/app:v1", wantDigest: "registry.example/app@" + m,
			wantLabels: managed, wantUnpackTo: "overlayfs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.config
			cfg.Snapshotter = "overlayfs"
			ft, cri := &fakeTransfer{source: tc.source}, &criCache{}
			p, store, ctx := img.puller(t, cfg, ft, cri, nil)

			resp, err := p.PullImage(ctx, &runtime.PullImageRequest{
				Image:         &runtime.ImageSpec{Image: tc.image, RuntimeHandler: tc.handler},
				SandboxConfig: tc.sandbox,
			})
			if err != nil {
				t.Fatalf("PullImage: %v", err)
			}
			if want := img.config.Digest.String(); resp.GetImageRef() != want {
				t.Errorf("ImageRef = %q, want the config digest %s", resp.GetImageRef(), want)
			}

			// What was asked of the transfer service.
			if src, ok := ft.src.(*registry.OCIRegistry); !ok || src.Image() != tc.wantRef {
				t.Errorf("source = %v, want the registry for %s", ft.src, tc.wantRef)
			}
			dst, ok := ft.dst.(destination)
			if !ok {
				t.Fatalf("destination = %T, want cripull's", ft.dst)
			}
			host := platforms.DefaultSpec()
			if got := dst.Platforms(); !reflect.DeepEqual(got, []ocispec.Platform{host}) {
				t.Errorf("platforms = %v, want the node's %v", got, host)
			}
			wantUnpack := []transfer.UnpackConfiguration{{Platform: host, Snapshotter: tc.wantUnpackTo}}
			if got := dst.UnpackPlatforms(); !reflect.DeepEqual(got, wantUnpack) {
				t.Errorf("unpack = %v, want %v", got, wantUnpack)
			}
			if dst.ref != tc.wantRef || dst.discard != tc.wantDiscard || dst.annotations == tc.noAnnotations {
				t.Errorf("destination ref %q, discard %v, annotations %v; want %q, %v, %v",
					dst.ref, dst.discard, dst.annotations, tc.wantRef, tc.wantDiscard, !tc.noAnnotations)
			}
			// The transfer service writes the record with CRI's labels
			// already: it is never there unmanaged, for GC or for CRI.
			if len(ft.stored) != 1 || ft.stored[0].Name != tc.wantRef || !maps.Equal(ft.stored[0].Labels, tc.wantLabels) {
				t.Errorf("transfer stored %+v, want %s with labels %v", ft.stored, tc.wantRef, tc.wantLabels)
			}
			if !ft.progress {
				t.Error("transfer without a progress func: image_pull_progress_timeout cannot see progress")
			}

			// What CRI and `ctr -n k8s.io images ls` see.
			want := slices.DeleteFunc([]string{img.config.Digest.String(), tc.wantTag, tc.wantDigest}, func(s string) bool { return s == "" })
			if !slices.Equal(cri.updated, want) {
				t.Errorf("CRI cache told of %v, want %v", cri.updated, want)
			}
			all, err := store.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			wantRecord := maps.Clone(tc.wantLabels)
			maps.Copy(wantRecord, tc.source)
			for _, r := range all {
				names = append(names, r.Name)
				if r.Target.Digest != img.manifest.Digest || !maps.Equal(r.Labels, wantRecord) {
					t.Errorf("record %s: target %s, labels %v; want %s, %v", r.Name, r.Target.Digest, r.Labels, m, wantRecord)
				}
			}
			if slices.Sort(names); !slices.Equal(names, slices.Sorted(slices.Values(want))) {
				t.Errorf("records %v, want %v", names, want)
			}
		})
	}
}

// lockedBuffer collects log output written from any goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPullCredentials: the registry gets the credentials CRI would send
// (the request's, else registry.configs' for its host) and
// registry.headers, and no log line of the pull, at any level, holds a
// secret.
func TestPullCredentials(t *testing.T) {
	img := newPulledImage(t)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name     string
		auth     *runtime.AuthConfig
		configs  *criconfig.AuthConfig // registry.configs auth for the registry's host
		wantUser string
		wantPass string
	}{
		{name: "the request's username and password", auth: &runtime.AuthConfig{Username: "alice", Password: "alice-pw"},
			wantUser: "alice", wantPass: "alice-pw"},
		{name: "the request's base64 auth", auth: &runtime.AuthConfig{Auth: b64("bob:bob-pw")},
			wantUser: "bob", wantPass: "bob-pw"},
		{name: "registry.configs for the host", configs: &criconfig.AuthConfig{Username: "cfg", Password: "cfg-pw"},
			wantUser: "cfg", wantPass: "cfg-pw"},
		{name: "the request's auth over registry.configs", auth: &runtime.AuthConfig{Username: "alice", Password: "alice-pw"},
			configs: &criconfig.AuthConfig{Username: "cfg", Password: "cfg-pw"}, wantUser: "alice", wantPass: "alice-pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu         sync.Mutex
				user, pass string
				header     string
			)
			// A registry that serves the image's manifest to a client
			// that authenticates (with anything), and says who it was.
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				u, p, ok := r.BasicAuth()
				if !ok {
					w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				mu.Lock()
				user, pass, header = u, p, r.Header.Get("X-Test-Header")
				mu.Unlock()
				if r.URL.Path != "/v2/app/manifests/v1" {
					w.WriteHeader(http.StatusNotFound)
					return
				}
				w.Header().Set("Content-Type", img.manifest.MediaType)
				w.Header().Set("Docker-Content-Digest", img.manifest.Digest.String())
				w.Header().Set("Content-Length", strconv.FormatInt(img.manifest.Size, 10))
			}))
			defer srv.Close()
			host := srv.Listener.Addr().String()

			cfg := criconfig.Images{Snapshotter: "overlayfs"}
			cfg.Registry.Headers = map[string][]string{"X-Test-Header": {"from-config"}}
			if tc.configs != nil {
				cfg.Registry.Configs = map[string]criconfig.RegistryConfig{host: {Auth: tc.configs}}
			}
			ft := &fakeTransfer{resolve: true}
			p, _, ctx := img.puller(t, cfg, ft, &criCache{}, nil)
			logs := &lockedBuffer{}
			logger := logrus.New()
			logger.SetOutput(logs)
			logger.SetLevel(logrus.TraceLevel)
			ctx = log.WithLogger(ctx, logrus.NewEntry(logger))

			if _, err := p.PullImage(ctx, &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: host + "/app:v1"}, Auth: tc.auth}); err != nil {
				t.Fatalf("PullImage: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if user != tc.wantUser || pass != tc.wantPass {
				t.Errorf("registry saw %q/%q, want %q/%q", user, pass, tc.wantUser, tc.wantPass)
			}
			if header != "from-config" {
				t.Errorf("registry saw X-Test-Header %q, want registry.headers' value", header)
			}
			out := logs.String()
			if !strings.Contains(out, "pulled image for CRI") {
				t.Fatalf("the pull logged no result line, so the check below checks nothing:\n%s", out)
			}
			for _, secret := range []string{tc.wantPass, b64(tc.wantUser + ":" + tc.wantPass)} {
				if strings.Contains(out, secret) {
					t.Errorf("the logs hold the secret %q:\n%s", secret, out)
				}
			}
		})
	}
}

// TestPullErrors: a reference CRI cannot parse is InvalidArgument before
// any transfer; a transfer that fails comes back in CRI's words, which
// kubelet shows in pod events, with its cause (and its code) kept; a
// stalled pull says so; what fails after the transfer says which step.
func TestPullErrors(t *testing.T) {
	img := newPulledImage(t)
	for _, tc := range []struct {
		name        string
		image       string
		timeout     string // image_pull_progress_timeout
		cancelled   bool   // the caller gave up before the pull
		transferErr error
		hang        bool // the transfer makes no progress
		storeNone   bool // the transfer succeeds without storing the image
		criErr      error
		updateErr   error
		wantAsks    int
		wantIs      error
		wantWords   string
	}{
		{name: "malformed reference", image: "UPPER/Case:v1",
			wantIs: errdefs.ErrInvalidArgument, wantWords: `parse image reference "UPPER/Case:v1"`},
		{name: "registry refused", image: "registry.example/app:v1", transferErr: errdefs.ErrUnauthenticated, wantAsks: 1,
			wantIs: errdefs.ErrUnauthenticated, wantWords: `failed to pull and unpack image "registry.example/app:v1"`},
		{name: "short name in the error as CRI normalizes it", image: "busybox", transferErr: errdefs.ErrNotFound, wantAsks: 1,
			wantIs: errdefs.ErrNotFound, wantWords: `failed to pull and unpack image "docker.io/library/busybox:latest"`},
		{name: "no progress", image: "registry.example/app:v1", timeout: "1ms", hang: true, wantAsks: 1,
			wantIs: context.DeadlineExceeded, wantWords: "no progress for 1ms (image_pull_progress_timeout)"},
		{name: "the caller gave up", image: "registry.example/app:v1", timeout: "1h", cancelled: true, hang: true, wantAsks: 1,
			wantIs: context.Canceled, wantWords: `failed to pull and unpack image "registry.example/app:v1"`},
		{name: "no record after the transfer", image: "registry.example/app:v1", storeNone: true, wantAsks: 1,
			wantIs: errdefs.ErrNotFound, wantWords: `get image "registry.example/app:v1" after its pull`},
		{name: "CRI's image service unavailable", image: "registry.example/app:v1", criErr: errdefs.ErrUnavailable, wantAsks: 1,
			wantIs: errdefs.ErrUnavailable, wantWords: "CRI image service"},
		{name: "CRI's cache refuses", image: "registry.example/app:v1", updateErr: errdefs.ErrFailedPrecondition, wantAsks: 1,
			wantIs: errdefs.ErrFailedPrecondition, wantWords: "update CRI's image cache for \"sha256:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTransfer{err: tc.transferErr, hang: tc.hang}
			var cri *criCache
			if tc.criErr == nil {
				cri = &criCache{err: tc.updateErr}
			}
			cfg := criconfig.Images{Snapshotter: "overlayfs", ImagePullProgressTimeout: tc.timeout}
			p, _, ctx := img.puller(t, cfg, ft, cri, tc.criErr)
			if tc.storeNone {
				ft.images = nil
			}
			if tc.cancelled {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			_, err := p.PullImage(ctx, &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: tc.image}})
			if !errors.Is(err, tc.wantIs) || err == nil || !strings.Contains(err.Error(), tc.wantWords) {
				t.Fatalf("PullImage: %v; want %v saying %q", err, tc.wantIs, tc.wantWords)
			}
			if ft.asks != tc.wantAsks {
				t.Fatalf("%d transfers, want %d", ft.asks, tc.wantAsks)
			}
		})
	}
}
