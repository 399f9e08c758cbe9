package transfer

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

// TestCredentialsIDNeverHangs runs credentialsID against containerd's own
// registry source, whose credentials goroutine stops serving when its
// context ends (even before reading a request) and sends nothing when the
// callback fails. Either way credentialsID must return.
func TestCredentialsIDNeverHangs(t *testing.T) {
	defer func(d time.Duration) { credentialsWait = d }(credentialsWait)
	credentialsWait = 200 * time.Millisecond
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
		}, false, context.DeadlineExceeded},
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
				_, ok, err := credentialsID(ctx, src, "example.com/app:1", "example.com")
				if ok {
					err = errors.New("ok without credentials")
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("credentialsID: %v, want %v", err, tc.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("credentialsID still waiting after 10s")
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
		id, ok, err := credentialsID(context.Background(), src, "example.com/app:1", "example.com")
		if err != nil || !ok || id == "" || id == "anonymous" {
			t.Fatalf("credentialsID = %q, %v, %v", id, ok, err)
		}
	})
}
