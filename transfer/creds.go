package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

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

// credentialsWait bounds the wait for a source's credentials. containerd's
// registry source sends no answer at all when its credentials callback
// fails; the pull then goes on unshared.
var credentialsWait = 10 * time.Second

// credentialsID returns a digest of the credentials src presents to host,
// so pulls are shared only between callers with the same credentials. A
// registry source hides its credentials callback, but exposes it as a
// stream when it describes itself; the stream is served in process here and
// asked once. ok is false when src cannot say.
func credentialsID(ctx context.Context, src marshaler, ref, host string) (id string, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, credentialsWait)
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
	// The source's goroutine stops serving when ctx ends, even before it
	// reads the request (a caller that gave up at once): closing the pipe
	// then is what keeps Send and Recv from waiting for ever.
	defer context.AfterFunc(ctx, func() { s.Close() })()
	asked := func(err error) error {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("ask credentials for %s: %w", host, err)
	}
	req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: host, Reference: ref})
	if err != nil {
		return "", false, err
	}
	if err := s.Ours.Send(req); err != nil {
		return "", false, asked(err)
	}
	a, err := s.Ours.Recv()
	if err != nil {
		return "", false, asked(err)
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
