package pullkey

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/proto"

	"github.com/pullwise/pullwise/transfer/source"
)

// marshaler is how transfer sources and destinations describe themselves;
// registry.OCIRegistry and image.Store implement it.
type marshaler interface {
	MarshalAny(context.Context, streaming.StreamCreator) (typeurl.Any, error)
}

// sourceID describes how src reaches the registry: a digest of the
// credentials it presents to host, and its resolver settings (headers,
// hosts dir, scheme), so pulls are shared only between callers that would
// fetch the same way. A registry source hides its credentials callback, but
// exposes it as a stream when it describes itself; the stream is served in
// process here and asked once. ok is false when src cannot say.
func sourceID(ctx context.Context, src marshaler, ref, host string) (creds, settings string, ok bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	// Cancelling ends the source's stream-serving goroutine.
	defer cancel()
	streams := &source.Streams{}
	desc, err := src.MarshalAny(ctx, streams)
	if err != nil {
		return "", "", false, fmt.Errorf("describe %s: %w", ref, err)
	}
	settings, err = resolverSettings(desc)
	if err != nil {
		return "", "", false, fmt.Errorf("describe %s: %w", ref, err)
	}
	s := streams.Stream()
	if s == nil {
		return "anonymous", settings, true, nil
	}
	defer s.Close()
	req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: host, Reference: ref})
	if err != nil {
		return "", "", false, err
	}
	a, err := s.Ask(ctx, req)
	if err != nil {
		return "", "", false, fmt.Errorf("ask credentials for %s: %w", host, err)
	}
	var resp transfertypes.AuthResponse
	if err := typeurl.UnmarshalTo(a, &resp); err != nil {
		return "", "", false, fmt.Errorf("decode credentials for %s: %w", host, err)
	}
	h := sha256.New()
	// Length-prefixed, so ("ab","c") and ("a","bc") differ.
	for _, f := range []string{resp.AuthType.String(), resp.Username, resp.Secret} {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil)), settings, true, nil
}

// resolverSettings encodes a registry source's resolver settings
// deterministically. The stream IDs are left out: they are new for every
// pull and say nothing of how it fetches. The reference is keyed apart,
// normalized.
func resolverSettings(desc typeurl.Any) (string, error) {
	var reg transfertypes.OCIRegistry
	if err := typeurl.UnmarshalTo(desc, &reg); err != nil {
		return "", fmt.Errorf("decode registry source: %w", err)
	}
	res := reg.GetResolver()
	if res == nil {
		return "", nil
	}
	res.AuthStream, res.LogsStream = "", ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
	if err != nil {
		return "", fmt.Errorf("encode resolver settings: %w", err)
	}
	return string(b), nil
}
