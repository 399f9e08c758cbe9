package applyopts

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// recorder is the differ below: it keeps the config its options make.
type recorder struct{ got diff.ApplyConfig }

func (r *recorder) Apply(_ context.Context, _ ocispec.Descriptor, _ []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	r.got = diff.ApplyConfig{}
	for _, o := range opts {
		if err := o(context.Background(), ocispec.Descriptor{}, &r.got); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	return ocispec.Descriptor{}, nil
}

func TestApplierAddsThePullsOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []diff.ApplyOpt
		want bool
	}{
		{name: "pull that asks", ctx: With(context.Background(), diff.WithSyncFs(true)), want: true},
		{name: "pull with no options", ctx: With(context.Background()), want: false},
		{name: "pull that does not", ctx: context.Background(), want: false},
		{name: "caller's own sync kept", ctx: context.Background(), opts: []diff.ApplyOpt{diff.WithSyncFs(true)}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			if _, err := (Applier{Applier: r}).Apply(tc.ctx, ocispec.Descriptor{}, nil, tc.opts...); err != nil {
				t.Fatal(err)
			}
			if r.got.SyncFs != tc.want {
				t.Fatalf("SyncFs = %v, want %v", r.got.SyncFs, tc.want)
			}
		})
	}
}
