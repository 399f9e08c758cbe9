// Package pullsource shows, through CRI, which registry served each image
// (KEP-4589): it copies the pull-source label the transfer layer sets onto
// every name CRI gives an image, adds it to verbose image and container
// status, and stamps it on containers when they are created, so a
// container keeps the source of the image it was created from.
package pullsource

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/transfer/aliases"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

const (
	// ContainerLabel is set on containers at creation.
	ContainerLabel = "io.pullwise.image-pull-source"
	// Verbose info keys, plain strings.
	InfoPullSource      = "pullSource"
	InfoBlobSources     = "pullSourceBlobs"
	InfoImagePullSource = "imagePullSource"
)

// CRI methods this package acts on.
const (
	methodPullImage       = "/runtime.v1.ImageService/PullImage"
	methodImageStatus     = "/runtime.v1.ImageService/ImageStatus"
	methodCreateContainer = "/runtime.v1.RuntimeService/CreateContainer"
	methodContainerStatus = "/runtime.v1.RuntimeService/ContainerStatus"
)

// Sources reads and writes pull-source labels in CRI's image store.
type Sources struct {
	images  images.Store
	content content.Provider
}

// New returns Sources over the metadata image and content stores.
func New(store images.Store, cs content.Provider) *Sources {
	return &Sources{images: store, content: cs}
}

// WithNames has the pull of ref under ctx store, with the image's record,
// the records CRI makes for it after the pull, labelled as that record is
// (transfer/aliases): CRI and LabelNames then find them made and write
// nothing.
func (s *Sources) WithNames(ctx context.Context, ref string) context.Context {
	named, err := reference.ParseDockerRef(ref)
	if err != nil || s.content == nil {
		return ctx
	}
	// The store asks once for a create and again for the update that
	// follows when the record exists (a re-pull), inside the node's one
	// write turn: the index and manifest are read once per target.
	var (
		mu     sync.Mutex
		target digest.Digest
		names  []string
	)
	return aliases.With(ctx, func(ctx context.Context, img images.Image) ([]string, error) {
		if img.Name != named.String() {
			return nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if target == img.Target.Digest {
			return names, nil
		}
		// As CRI finds the ID: its client's default platform.
		config, err := images.Config(ctx, s.content, img.Target, platforms.Default())
		if err != nil {
			return nil, fmt.Errorf("config of %s: %w", img.Name, err)
		}
		repoDigest, _ := RepoDigestAndTag(named, img.Target.Digest)
		target, names = img.Target.Digest, []string{config.Digest.String(), repoDigest}
		return names, nil
	})
}

// RepoDigestAndTag are the names CRI gives a pulled image besides its ID,
// as its images service derives them.
func RepoDigestAndTag(named reference.Named, target digest.Digest) (repoDigest, repoTag string) {
	if _, ok := named.(reference.NamedTagged); ok {
		repoTag = named.String()
	}
	if _, ok := named.(reference.Canonical); ok {
		return named.String(), repoTag
	}
	return named.Name() + "@" + target.String(), repoTag
}

// Of returns an image's pull source and blob sources, from the first of
// its records (tags, then digests, then ID) that has one. Images that were
// never pulled (imported, preloaded) have none: "".
func (s *Sources) Of(ctx context.Context, img *runtime.Image) (pullSource, blobs string) {
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	names := append(append(append([]string{}, img.GetRepoTags()...), img.GetRepoDigests()...), img.GetId())
	for _, n := range names {
		rec, err := s.images.Get(ctx, n)
		if err != nil {
			continue
		}
		if v := rec.Labels[sourcelabel.PullSource]; v != "" {
			return v, rec.Labels[sourcelabel.BlobSources]
		}
	}
	return "", ""
}

// ofName returns the labels of the record an image reference or ID names.
func (s *Sources) ofName(ctx context.Context, name string) (map[string]string, error) {
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	candidates := []string{name}
	if n, err := reference.ParseDockerRef(name); err == nil && n.String() != name {
		candidates = append(candidates, n.String())
	}
	for _, c := range candidates {
		rec, err := s.images.Get(ctx, c)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return rec.Labels, nil
	}
	return nil, nil
}

// UnaryServerInterceptor implements interceptor.Unary.
func (s *Sources) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch info.FullMethod {
		case methodCreateContainer:
			if r, ok := req.(*runtime.CreateContainerRequest); ok {
				s.stampContainer(ctx, r)
			}
		case methodPullImage:
			if r, ok := req.(*runtime.PullImageRequest); ok {
				ctx = s.WithNames(ctx, r.GetImage().GetImage())
			}
		}
		resp, err := handler(ctx, req)
		if err != nil {
			return resp, err
		}
		switch info.FullMethod {
		case methodPullImage:
			r, _ := req.(*runtime.PullImageRequest)
			out, _ := resp.(*runtime.PullImageResponse)
			s.LabelNames(ctx, r.GetImage().GetImage(), out.GetImageRef())
		case methodImageStatus:
			r, _ := req.(*runtime.ImageStatusRequest)
			out, _ := resp.(*runtime.ImageStatusResponse)
			if r.GetVerbose() && out.GetImage() != nil {
				src, blobs := s.Of(ctx, out.GetImage())
				if out.Info == nil {
					out.Info = map[string]string{}
				}
				out.Info[InfoPullSource] = src
				if blobs != "" {
					out.Info[InfoBlobSources] = blobs
				}
			}
		case methodContainerStatus:
			r, _ := req.(*runtime.ContainerStatusRequest)
			out, _ := resp.(*runtime.ContainerStatusResponse)
			if r.GetVerbose() && out.GetStatus() != nil {
				if out.Info == nil {
					out.Info = map[string]string{}
				}
				out.Info[InfoImagePullSource] = out.GetStatus().GetLabels()[ContainerLabel]
			}
		}
		return resp, nil
	}
}

// LabelNames copies the pull-source labels from the record the pull
// stored (named by the reference asked for) to the records CRI adds after
// the transfer: the repo digest and the image ID.
func (s *Sources) LabelNames(ctx context.Context, ref, imageID string) {
	s.labelImage(ctx, ref, imageID, func(pulled images.Image) map[string]string {
		return sourcelabel.Of(pulled.Labels)
	})
}

// Record sets the pull source of the image ref names on its tag, repo
// digest and ID records, keeping the blob sources it had: for a check that
// asked the registry and found the image up to date.
func (s *Sources) Record(ctx context.Context, ref, imageID, pullSource string) {
	if pullSource == "" {
		return
	}
	s.labelImage(ctx, ref, imageID, func(images.Image) map[string]string {
		return map[string]string{sourcelabel.PullSource: pullSource}
	})
}

// labelImage sets labels on every name CRI gives the image ref names: the
// tag (or digest) record, the repo digest and the image ID. want derives
// the labels from the record ref names.
func (s *Sources) labelImage(ctx context.Context, ref, imageID string, want func(images.Image) map[string]string) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return
	}
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	pulled, err := s.images.Get(ctx, named.String())
	if err != nil {
		log.G(ctx).WithError(err).WithField("ref", named.String()).Debug("image record not found; pull source not recorded")
		return
	}
	labels := want(pulled)
	repoDigest, _ := RepoDigestAndTag(named, pulled.Target.Digest)
	names := []string{named.String(), repoDigest}
	if imageID != "" {
		names = append(names, imageID)
	}
	for _, n := range names {
		rec, err := s.images.Get(ctx, n)
		if err != nil {
			continue
		}
		if err := sourcelabel.Set(ctx, s.images, rec, labels); err != nil {
			log.G(ctx).WithError(err).WithField("image", n).Warn("pull source not recorded")
		}
	}
}

// stampContainer adds the image's pull source to the container's labels,
// where it stays for the container's life whatever happens to the image.
func (s *Sources) stampContainer(ctx context.Context, r *runtime.CreateContainerRequest) {
	cfg := r.GetConfig()
	if cfg == nil {
		return
	}
	labels, err := s.ofName(ctx, cfg.GetImage().GetImage())
	if err != nil || labels[sourcelabel.PullSource] == "" {
		return
	}
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels[ContainerLabel] = labels[sourcelabel.PullSource]
}
