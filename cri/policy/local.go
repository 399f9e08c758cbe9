package policy

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// ImageStatuser is CRI's ImageStatus.
type ImageStatuser interface {
	ImageStatus(context.Context, *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error)
}

// CRILocal returns a Deps.Local that asks CRI whether it has the image (so
// "present" means what kubelet would see) and reads the digest the name
// points to from the image store. cri is looked up per call: CRI loads
// after the plugins that use this.
func CRILocal(cri func() (ImageStatuser, error), store images.Store) func(context.Context, string) (Local, bool, error) {
	return func(ctx context.Context, ref string) (Local, bool, error) {
		c, err := cri()
		if err != nil {
			return Local{}, false, err
		}
		ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
		resp, err := c.ImageStatus(ctx, &runtime.ImageStatusRequest{Image: &runtime.ImageSpec{Image: ref}})
		if err != nil {
			return Local{}, false, fmt.Errorf("image status: %w", err)
		}
		if resp.GetImage() == nil {
			return Local{}, false, nil
		}
		l := Local{ImageID: resp.GetImage().GetId()}
		named, err := reference.ParseDockerRef(ref)
		if err != nil {
			return Local{}, false, err
		}
		if d, ok := named.(reference.Digested); ok {
			l.Target = d.Digest()
			return l, true, nil
		}
		rec, err := store.Get(ctx, named.String())
		if errors.Is(err, errdefs.ErrNotFound) {
			// CRI knows the image by another name only.
			return Local{}, false, nil
		}
		if err != nil {
			return Local{}, false, err
		}
		l.Target = rec.Target.Digest
		return l, true, nil
	}
}
