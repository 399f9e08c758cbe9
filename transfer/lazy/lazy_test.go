package lazy

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

type answer struct {
	snapshots.Snapshotter
	err error
}

func (a answer) Prepare(context.Context, string, string, ...snapshots.Opt) ([]mount.Mount, error) {
	return nil, a.err
}

func TestPrepareReportsLazyLayers(t *testing.T) {
	layer := digest.FromString("layer")
	remote := map[string]string{snapshots.LabelSnapshotRef: "sha256:chain", layerDigestLabel: layer.String()}
	for _, tc := range []struct {
		name   string
		err    error
		labels map[string]string
		want   []digest.Digest
	}{
		{name: "mounted by the snapshotter", err: errdefs.ErrAlreadyExists, labels: remote, want: []digest.Digest{layer}},
		{name: "prepared for extraction", err: nil, labels: remote},
		{name: "failed", err: errors.New("disk full"), labels: remote},
		{name: "no target snapshot", err: errdefs.ErrAlreadyExists, labels: map[string]string{layerDigestLabel: layer.String()}},
		{name: "no layer digest", err: errdefs.ErrAlreadyExists, labels: map[string]string{snapshots.LabelSnapshotRef: "sha256:chain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []digest.Digest
			ctx := WithObserver(context.Background(), func(d digest.Digest) { got = append(got, d) })
			_, err := Snapshotter{answer{err: tc.err}}.Prepare(ctx, "key", "", snapshots.WithLabels(tc.labels))
			if !errors.Is(err, tc.err) {
				t.Fatalf("Prepare returned %v, want the snapshotter's %v", err, tc.err)
			}
			if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
				t.Fatalf("observed %v, want %v", got, tc.want)
			}
		})
	}
	// A Prepare outside any pull (ctr snapshots prepare) has no observer.
	if _, err := (Snapshotter{answer{err: errdefs.ErrAlreadyExists}}).Prepare(context.Background(), "k", "", snapshots.WithLabels(remote)); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Prepare without an observer: %v", err)
	}
}
