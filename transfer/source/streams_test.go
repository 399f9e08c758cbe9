package source

import (
	"context"
	"errors"
	"testing"
	"time"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/transfer/registry"
	"github.com/containerd/typeurl/v2"
)

type credsFunc func(host string) (registry.Credentials, error)

func (f credsFunc) GetCredentials(_ context.Context, _, host string) (registry.Credentials, error) {
	return f(host)
}

// ask describes a containerd registry source with creds, as the transfer
// layer does, and asks its credentials stream once.
func ask(t *testing.T, ctx context.Context, creds credsFunc) (*transfertypes.AuthResponse, error) {
	t.Helper()
	src, err := registry.NewOCIRegistry(ctx, "example.com/app:v1", registry.WithCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	streams := &Streams{}
	if _, err := src.MarshalAny(ctx, streams); err != nil {
		t.Fatal(err)
	}
	p := streams.Stream()
	defer p.Close()
	req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: "example.com", Reference: "example.com/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Ask(ctx, req)
	if err != nil {
		return nil, err
	}
	var resp transfertypes.AuthResponse
	if err := typeurl.UnmarshalTo(a, &resp); err != nil {
		t.Fatal(err)
	}
	return &resp, nil
}

func TestAskCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name     string
		creds    credsFunc
		wantUser string
		wantErr  error
	}{
		{"answered", func(string) (registry.Credentials, error) {
			return registry.Credentials{Username: "alice", Secret: "pw"}, nil
		}, "alice", nil},
		// containerd's source logs a failing helper and answers nothing: the
		// question must fail, not wait for ever.
		{"helper fails", func(string) (registry.Credentials, error) {
			return registry.Credentials{}, errors.New("no credentials for you")
		}, "", errNoAnswer},
		// An answer that does not encode (invalid UTF-8) is dropped too.
		{"answer does not encode", func(string) (registry.Credentials, error) {
			return registry.Credentials{Username: "u", Secret: "\xff"}, nil
		}, "", errNoAnswer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := ask(t, ctx, tc.creds)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && resp.GetUsername() != tc.wantUser {
				t.Fatalf("user %q, want %q", resp.GetUsername(), tc.wantUser)
			}
			if ctx.Err() != nil {
				t.Fatal("asking waited until the test deadline")
			}
		})
	}
}

func TestAskEndsWithContext(t *testing.T) {
	p := newPipe() // nobody serves it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Ask(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, err := p.Ask(context.Background(), nil); err == nil {
		t.Fatal("a source given up on was asked again")
	}
}
