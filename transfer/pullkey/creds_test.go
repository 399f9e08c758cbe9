package pullkey

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer/registry"
)

type credsFunc func(context.Context, string, string) (registry.Credentials, error)

func (f credsFunc) GetCredentials(ctx context.Context, ref, host string) (registry.Credentials, error) {
	return f(ctx, ref, host)
}

// TestSourceIDNeverHangs runs sourceID against containerd's own registry
// source, whose credentials goroutine stops serving when its context ends
// (even before reading a request) and sends nothing when the callback
// fails. Either way sourceID must return, with an error.
func TestSourceIDNeverHangs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		creds   credsFunc
		cancel  bool
		wantErr error
	}{
		{"caller gone", func(context.Context, string, string) (registry.Credentials, error) {
			return registry.Credentials{Username: "u", Secret: "s"}, nil
		}, true, context.Canceled},
		{"callback fails", func(context.Context, string, string) (registry.Credentials, error) {
			return registry.Credentials{}, errors.New("no helper")
		}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src, err := registry.NewOCIRegistry(ctx, "example.com/app:1", registry.WithCredentials(tc.creds))
			if err != nil {
				t.Fatal(err)
			}
			if tc.cancel {
				cancel()
			}
			done := make(chan error, 1)
			go func() {
				_, _, ok, err := sourceID(ctx, src, "example.com/app:1", "example.com")
				if ok {
					err = errors.New("ok without credentials")
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
					t.Fatalf("sourceID: %v, want an error (%v)", err, tc.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("sourceID still waiting after 10s")
			}
		})
	}
	t.Run("answers", func(t *testing.T) {
		src, err := registry.NewOCIRegistry(context.Background(), "example.com/app:1", registry.WithCredentials(credsFunc(
			func(context.Context, string, string) (registry.Credentials, error) {
				return registry.Credentials{Username: "u", Secret: "s"}, nil
			})))
		if err != nil {
			t.Fatal(err)
		}
		id, _, ok, err := sourceID(context.Background(), src, "example.com/app:1", "example.com")
		if err != nil || !ok || id == "" || id == "anonymous" {
			t.Fatalf("sourceID = %q, %v, %v", id, ok, err)
		}
	})
}
