// Package cripull serves CRI PullImage through the transfer service when
// CRI itself would not. CRI's image plugin takes its own local pull path
// (client.Pull) when its config holds an option the transfer service does
// not support (use_local_image_pull, discard_unpacked_layers, snapshot
// annotations, sync fs, the deprecated registry keys, its own
// max_concurrent_downloads): every Pullwise feature lives behind the
// transfer service, so those pulls would get none. The Puller does what
// CRI's PullImage does on its transfer path, plus what those options mean
// on its local one, and leaves CRI's records and cache as CRI's own pull
// would.
package cripull

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/core/transfer/registry"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/imgcrypt/v2"
	"github.com/containerd/imgcrypt/v2/images/encryption"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/transfer/applyopts"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

// CRI labels, as upstream's internal/cri/labels names them.
const (
	managedLabel = "io.cri-containerd.image"
	managedValue = "managed"
	pinnedLabel  = "io.cri-containerd.pinned"
	pinnedValue  = "pinned"
	// runtimeHandlerAnnotation is CRI's deprecated pod annotation for the
	// runtime handler, still read when PullImage names none.
	runtimeHandlerAnnotation = "io.containerd.cri.runtime-handler"
)

// CRIImages is the CRI image service's cache: UpdateImage makes it read
// a record again, as CRI does after its own pulls.
type CRIImages interface {
	UpdateImage(ctx context.Context, ref string) error
}

// Deps is what a Puller works with.
type Deps struct {
	// Transfer is the node's transfer service (Pullwise's).
	Transfer transfer.Transferrer
	Images   images.Store
	Content  content.Store
	// CRI is the CRI image service, for its cache.
	CRI func() (CRIImages, error)
	// Config is CRI's image config, as in force after CRI's init.
	Config criconfig.Images
	// HostDir is the hosts.toml root(s) pulls resolve with: CRI's
	// config_path, or where WriteMirrorHosts wrote registry.mirrors.
	HostDir string
}

// Puller pulls for CRI.
type Puller struct {
	deps            Deps
	progressTimeout time.Duration
}

// New returns a Puller.
func New(deps Deps) (*Puller, error) {
	p := &Puller{deps: deps}
	if s := deps.Config.ImagePullProgressTimeout; s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("image_pull_progress_timeout %q: %w", s, err)
		}
		p.progressTimeout = d
	}
	return p, nil
}

// PullImage implements CRI's PullImage.
func (p *Puller) PullImage(ctx context.Context, r *runtime.PullImageRequest) (*runtime.PullImageResponse, error) {
	id, err := p.pull(ctx, r)
	if err != nil {
		return nil, err
	}
	return &runtime.PullImageResponse{ImageRef: id}, nil
}

func (p *Puller) pull(ctx context.Context, r *runtime.PullImageRequest) (string, error) {
	start := time.Now()
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	name := r.GetImage().GetImage()
	named, err := reference.ParseDockerRef(name)
	if err != nil {
		return "", fmt.Errorf("parse image reference %q: %w", name, errors.Join(err, errdefs.ErrInvalidArgument))
	}
	ref := named.String()
	cfg := p.deps.Config
	snapshotter := p.snapshotter(ctx, ref, r)
	labels := p.labels(ref)

	dst := destination{
		imageStore: transferimage.NewStore(ref,
			transferimage.WithPlatforms(platforms.DefaultSpec()),
			transferimage.WithUnpack(platforms.DefaultSpec(), snapshotter),
			transferimage.WithImageLabels(labels)),
		ref:         ref,
		discard:     cfg.DiscardUnpackedLayers,
		annotations: !cfg.DisableSnapshotAnnotations,
	}
	src, err := registry.NewOCIRegistry(ctx, ref,
		registry.WithCredentials(credentials{ref: ref, auth: r.GetAuth(), configs: cfg.Registry.Configs}),
		registry.WithHeaders(http.Header(cfg.Registry.Headers)),
		registry.WithHostDir(p.deps.HostDir))
	if err != nil {
		return "", fmt.Errorf("registry for %q: %w", ref, err)
	}

	pctx, watch, stop := watchStall(applyopts.With(ctx, p.applyOpts()...), p.progressTimeout)
	err = p.deps.Transfer.Transfer(pctx, src, dst, transfer.WithProgress(watch.progress))
	stop()
	if err != nil {
		if cause := context.Cause(pctx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		// CRI's words, which kubelet shows in pod events.
		return "", fmt.Errorf("failed to pull and unpack image %q: %w", ref, err)
	}

	img, err := p.deps.Images.Get(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("get image %q after its pull: %w", ref, err)
	}
	configDesc, err := images.Config(ctx, p.deps.Content, img.Target, platforms.Default())
	if err != nil {
		return "", fmt.Errorf("get image config of %q: %w", ref, err)
	}
	imageID := configDesc.Digest.String()
	repoDigest, repoTag := pullsource.RepoDigestAndTag(named, img.Target.Digest)
	// A PullImage's pull made these records with its own
	// (pullsource.WithNames, set by the pull-source interceptor around
	// this one); the sandbox image's, pulled past the interceptors, did
	// not. Where it did not, the records made here carry the pull
	// source the transfer service set on the tag's from their first
	// write. Labelled afterwards, as cri/pullsource does records that
	// already exist, each would cost one more synced write to the metadata
	// database, which a burst of pulls waits on (docs/benchmarks.md).
	labels = maps.Clone(labels)
	for k, v := range sourcelabel.Of(img.Labels) {
		if v != "" {
			labels[k] = v
		}
	}
	cri, err := p.deps.CRI()
	if err != nil {
		return "", fmt.Errorf("CRI image service: %w", err)
	}
	for _, n := range []string{imageID, repoTag, repoDigest} {
		if n == "" {
			continue
		}
		if err := p.createOrUpdate(ctx, n, img.Target, labels); err != nil {
			return "", fmt.Errorf("create image reference %q: %w", n, err)
		}
		// CRI answers ImageStatus from its cache; its event handler
		// would catch up later, but the pull must be visible when it
		// returns, as after CRI's own.
		if err := cri.UpdateImage(ctx, n); err != nil {
			return "", fmt.Errorf("update CRI's image cache for %q: %w", n, err)
		}
	}
	log.G(ctx).WithFields(log.Fields{
		"image": name, "id": imageID, "repoTag": repoTag, "repoDigest": repoDigest,
		"elapsed": time.Since(start),
	}).Info("pulled image for CRI through the transfer service")
	return imageID, nil
}

// EnsureSandboxImage pulls the sandbox image for a RunPodSandbox when the
// node lacks it: CRI would pull it in process, on its local path, past
// Pullwise. config and runtimeHandler are the sandbox's.
func (p *Puller) EnsureSandboxImage(ctx context.Context, config *runtime.PodSandboxConfig, runtimeHandler string) error {
	ref := p.deps.Config.PinnedImages["sandbox"]
	if ref == "" {
		return nil
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		// CRI reports a bad sandbox image itself.
		return nil
	}
	if _, err := p.deps.Images.Get(namespaces.WithNamespace(ctx, criconfig.Namespace), named.String()); err == nil {
		return nil
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("look up sandbox image %q: %w", ref, err)
	}
	req := &runtime.PullImageRequest{
		Image:         &runtime.ImageSpec{Image: ref, RuntimeHandler: runtimeHandler},
		SandboxConfig: config,
	}
	if _, err := p.pull(ctx, req); err != nil {
		return fmt.Errorf("failed to pull image %q: %w", ref, err)
	}
	return nil
}

// snapshotter is CRI's choice: the runtime handler's snapshotter
// (runtime_platforms), else the default one. As in CRI, a request without
// a sandbox config gets the default one, whatever runtime handler it names.
func (p *Puller) snapshotter(ctx context.Context, ref string, r *runtime.PullImageRequest) string {
	sn := p.deps.Config.Snapshotter
	if r.GetSandboxConfig() == nil {
		return sn
	}
	handler := r.GetImage().GetRuntimeHandler()
	if handler == "" {
		handler = r.GetSandboxConfig().GetAnnotations()[runtimeHandlerAnnotation]
	}
	if handler == "" {
		return sn
	}
	if rp, ok := p.deps.Config.RuntimePlatforms[handler]; ok && rp.Snapshotter != "" && rp.Snapshotter != sn {
		log.G(ctx).WithFields(log.Fields{"image": ref, "runtime": handler, "snapshotter": rp.Snapshotter}).
			Info("pulling for the runtime handler's snapshotter")
		return rp.Snapshotter
	}
	return sn
}

// labels are CRI's: managed, and pinned for an image pinned_images names
// exactly.
func (p *Puller) labels(ref string) map[string]string {
	l := map[string]string{managedLabel: managedValue}
	for _, pinned := range p.deps.Config.PinnedImages {
		if pinned == ref {
			l[pinnedLabel] = pinnedValue
		}
	}
	return l
}

// applyOpts are CRI's local path's unpack options that apply per layer.
func (p *Puller) applyOpts() []diff.ApplyOpt {
	var opts []diff.ApplyOpt
	if p.deps.Config.ImagePullWithSyncFs {
		opts = append(opts, diff.WithSyncFs(true))
	}
	if p.deps.Config.ImageDecryption.KeyModel == criconfig.KeyModelNode {
		opts = append(opts, func(ctx context.Context, desc ocispec.Descriptor, c *diff.ApplyConfig) error {
			// A payload per layer: imgcrypt's option writes the layer's
			// descriptor into it, and layers are applied in parallel.
			return encryption.WithDecryptedUnpack(&imgcrypt.Payload{})(ctx, desc, c)
		})
	}
	return opts
}

// createOrUpdate writes a CRI image record as CRI does: created with the
// labels, or pointed at the new target, with the managed and pinned
// labels set by field path so other labels (the pull source) stay.
func (p *Puller) createOrUpdate(ctx context.Context, name string, target ocispec.Descriptor, labels map[string]string) error {
	img := images.Image{Name: name, Target: target, Labels: labels}
	// Looked up first: the pull has usually made the record, and a create
	// that fails waits for the database's one writer all the same.
	old, err := p.deps.Images.Get(ctx, name)
	if errdefs.IsNotFound(err) {
		if _, err = p.deps.Images.Create(ctx, img); err == nil || !errdefs.IsAlreadyExists(err) {
			return err
		}
		old, err = p.deps.Images.Get(ctx, name)
	}
	if err != nil {
		return err
	}
	paths := []string{"target"}
	if old.Labels[managedLabel] != labels[managedLabel] {
		paths = append(paths, "labels."+managedLabel)
	}
	if labels[pinnedLabel] == pinnedValue && old.Labels[pinnedLabel] != pinnedValue {
		paths = append(paths, "labels."+pinnedLabel)
	}
	if old.Target.Digest == target.Digest && len(paths) == 1 {
		return nil
	}
	_, err = p.deps.Images.Update(ctx, img, paths...)
	return err
}
