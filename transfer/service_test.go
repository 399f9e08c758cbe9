package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recordingTransferrer stands in for containerd's local transfer service.
type recordingTransferrer struct {
	calls int
	err   error
}

func (r *recordingTransferrer) Transfer(context.Context, any, any, ...transfer.Opt) error {
	r.calls++
	return r.err
}

type fetcher struct{}

func (fetcher) Resolve(context.Context) (string, ocispec.Descriptor, error) {
	return "", ocispec.Descriptor{}, nil
}
func (fetcher) Fetcher(context.Context, string) (transfer.Fetcher, error) { return nil, nil }

type storer struct{}

func (storer) Store(context.Context, ocispec.Descriptor, images.Store) ([]images.Image, error) {
	return nil, nil
}

func TestServiceCountsPullsAndPassesEverythingOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst any
		err      error
		pulled   float64
		failed   float64
	}{
		{name: "pull", src: fetcher{}, dst: storer{}, pulled: 1},
		{name: "failed pull", src: fetcher{}, dst: storer{}, err: errors.New("boom"), failed: 1},
		{name: "not a pull", src: storer{}, dst: storer{}},
		{name: "not a pull, failing", src: "x", dst: "y", err: errors.New("boom")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := &recordingTransferrer{err: tc.err}
			s, err := New(next, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Transfer(context.Background(), tc.src, tc.dst); !errors.Is(err, tc.err) {
				t.Fatalf("Transfer returned %v, want %v", err, tc.err)
			}
			if next.calls != 1 {
				t.Fatalf("wrapped service called %d times, want 1", next.calls)
			}
			if got := testutil.ToFloat64(s.pulls.WithLabelValues(OutcomePulled)); got != tc.pulled {
				t.Errorf("pulled = %v, want %v", got, tc.pulled)
			}
			if got := testutil.ToFloat64(s.pulls.WithLabelValues(OutcomeFailed)); got != tc.failed {
				t.Errorf("failed = %v, want %v", got, tc.failed)
			}
		})
	}
}

var (
	_ transfer.ImageFetcher = fetcher{}
	_ transfer.ImageStorer  = storer{}
)
