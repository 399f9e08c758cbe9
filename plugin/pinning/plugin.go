// Package pinning registers the interceptor plugin "pinning": it keeps the
// images named by CRI's pinned_images pinned and, with protect_pinned_images,
// refuses their removal. The logic is in cri/pinning.
package pinning

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"google.golang.org/grpc"

	"github.com/pullwise/pullwise/cri/pinning"
	"github.com/pullwise/pullwise/plugin/interceptor"
	"github.com/pullwise/pullwise/plugin/pullwise"
)

func init() {
	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "pinning",
		Requires: []plugin.Type{
			plugins.EventPlugin,
			plugins.MetadataPlugin,
			plugins.CRIServicePlugin,
			// For ordering only: the pullwise plugin's config is read here.
			plugins.GRPCPlugin,
		},
		InitFn: initPinning,
	})
}

func initPinning(ic *plugin.InitContext) (any, error) {
	criImages := ic.Plugins().Get(plugins.CRIServicePlugin, "images")
	if criImages == nil {
		return nil, fmt.Errorf("CRI images plugin is not loaded, so nothing is pinned: %w", plugin.ErrSkipPlugin)
	}
	criService, err := criImages.Instance()
	if err != nil {
		return nil, fmt.Errorf("CRI images plugin failed to start, so nothing is pinned (%v): %w", err, plugin.ErrSkipPlugin)
	}
	criStatus, ok := criService.(pinning.CRIImageStatus)
	if !ok {
		return nil, fmt.Errorf("CRI images plugin instance %T does not serve ImageStatus", criService)
	}
	pinnedImages, err := pinning.PinnedImagesFromCRIConfig(criImages.Config)
	if err != nil {
		return nil, err
	}
	pins, err := pinning.NewPins(pinnedImages)
	if err != nil {
		// The valid values still get pinned; see NewPins.
		log.G(ic.Context).WithError(err).Warn("some pinned_images cannot be pinned")
	}
	log.G(ic.Context).WithField("pinned_images", pinnedImages).Info("pinning the images CRI's pinned_images names")

	m, err := ic.GetSingle(plugins.MetadataPlugin)
	if err != nil {
		return nil, err
	}
	// The metadata store publishes image events, which CRI follows to
	// update Image.pinned.
	store := metadata.NewImageStore(m.(*metadata.DB))
	e, err := ic.GetSingle(plugins.EventPlugin)
	if err != nil {
		return nil, err
	}
	subscriber, ok := e.(events.Subscriber)
	if !ok {
		return nil, fmt.Errorf("event plugin instance %T cannot be subscribed to", e)
	}

	p := &pinningPlugin{done: make(chan struct{})}
	if protectPinnedImages(ic.Plugins()) {
		guard := pinning.NewGuard(store, pins)
		p.unary = pinning.NewRemovalInterceptor(guard, criStatus).UnaryServerInterceptor()
	} else {
		log.G(ic.Context).Info("protect_pinned_images = false: pinned images can be removed")
		p.unary = passThrough
	}

	// CRI has loaded (its plugins come first), and it reads pins from labels
	// both when it loads its image store and on the events the reconciler's
	// writes publish; either way it ends up reporting them.
	var ctx context.Context
	ctx, p.cancel = context.WithCancel(ic.Context)
	reconciler := pinning.NewReconciler(store, pins)
	go func() {
		defer close(p.done)
		if err := reconciler.Watch(ctx, subscriber); err != nil {
			log.G(ctx).WithError(err).Error("pinned images are no longer reconciled")
		}
	}()
	return p, nil
}

// protectPinnedImages reads the pullwise plugin's config. Without that
// plugin the default, protecting, applies.
func protectPinnedImages(set *plugin.Set) bool {
	if p := set.Get(plugins.GRPCPlugin, "pullwise"); p != nil {
		if c, ok := p.Config.(*pullwise.Config); ok {
			return c.ProtectPinnedImages
		}
	}
	return pullwise.DefaultConfig().ProtectPinnedImages
}

func passThrough(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(ctx, req)
}

// pinningPlugin owns the reconciling goroutine: containerd closes plugins on
// shutdown, which ends it.
type pinningPlugin struct {
	unary  grpc.UnaryServerInterceptor
	cancel context.CancelFunc
	done   chan struct{}
}

// UnaryServerInterceptor implements interceptor.Unary.
func (p *pinningPlugin) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return p.unary }

// Close stops reconciling and waits for the pass in progress, so that no
// write reaches the metadata store after it is closed.
func (p *pinningPlugin) Close() error {
	p.cancel()
	<-p.done
	return nil
}
