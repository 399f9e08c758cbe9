// Package pullkey says which pulls may share one transfer (transfer/dedupe):
// those whose key is equal would fetch the same bytes, the same way, into
// the same place.
package pullkey

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"
	"github.com/distribution/reference"
	"google.golang.org/protobuf/proto"
)

// imageNamer is a pull source that names the image it pulls, as
// registry.OCIRegistry does.
type imageNamer interface {
	Image() string
}

// Of identifies pulls that may share one transfer: same namespace,
// normalized reference, destination (names, labels, platforms, unpack
// snapshotters), credentials and resolver settings (headers, hosts dir,
// scheme). ok is false when the pull cannot be
// described well enough to share it safely.
func Of(ctx context.Context, src, dst any) (key string, ok bool, err error) {
	named, isNamed := src.(imageNamer)
	srcM, srcOK := src.(marshaler)
	dstM, dstOK := dst.(marshaler)
	if !isNamed || !srcOK || !dstOK {
		return "", false, nil
	}
	ref := named.Image()
	host := ""
	norm := ref
	if n, err := reference.ParseDockerRef(ref); err == nil {
		norm, host = n.String(), reference.Domain(n)
	}
	creds, settings, ok, err := sourceID(ctx, srcM, ref, host)
	if err != nil || !ok {
		return "", false, err
	}
	dest, err := canonical(ctx, dstM)
	if err != nil {
		return "", false, err
	}
	ns, _ := namespaces.Namespace(ctx)
	h := sha256.New()
	for _, f := range []string{ns, norm, creds, settings, dest} {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil)), true, nil
}

// canonical encodes a destination deterministically; its Any form has maps
// (labels) whose wire order varies.
func canonical(ctx context.Context, m marshaler) (string, error) {
	a, err := m.MarshalAny(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("describe destination: %w", err)
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		return "", fmt.Errorf("decode destination: %w", err)
	}
	pm, ok := v.(proto.Message)
	if !ok {
		return "", fmt.Errorf("destination %T is not a protobuf message", v)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pm)
	if err != nil {
		return "", fmt.Errorf("encode destination: %w", err)
	}
	return a.GetTypeUrl() + ":" + string(b), nil
}
