package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/typeurl/v2"

	"github.com/pullwise/pullwise/transfer/source"
)

// marshaler is how transfer sources and destinations describe themselves;
// registry.OCIRegistry and image.Store implement it.
type marshaler interface {
	MarshalAny(context.Context, streaming.StreamCreator) (typeurl.Any, error)
}

// credentialsID returns a digest of the credentials src presents to host,
// so pulls are shared only between callers with the same credentials. A
// registry source hides its credentials callback, but exposes it as a
// stream when it describes itself; the stream is served in process here and
// asked once. ok is false when src cannot say.
func credentialsID(ctx context.Context, src marshaler, ref, host string) (id string, ok bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	// Cancelling ends the source's stream-serving goroutine.
	defer cancel()
	streams := &source.Streams{}
	if _, err := src.MarshalAny(ctx, streams); err != nil {
		return "", false, fmt.Errorf("describe %s: %w", ref, err)
	}
	s := streams.Stream()
	if s == nil {
		return "anonymous", true, nil
	}
	defer s.Close()
	req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: host, Reference: ref})
	if err != nil {
		return "", false, err
	}
	if err := s.Ours.Send(req); err != nil {
		return "", false, fmt.Errorf("ask credentials for %s: %w", host, err)
	}
	a, err := s.Ours.Recv()
	if err != nil {
		return "", false, fmt.Errorf("ask credentials for %s: %w", host, err)
	}
	var resp transfertypes.AuthResponse
	if err := typeurl.UnmarshalTo(a, &resp); err != nil {
		return "", false, fmt.Errorf("decode credentials for %s: %w", host, err)
	}
	h := sha256.New()
	// Length-prefixed, so ("ab","c") and ("a","bc") differ.
	for _, f := range []string{resp.AuthType.String(), resp.Username, resp.Secret} {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil)), true, nil
}
