package pullkey

import (
	"context"
	"net/http"
	"testing"

	"github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/core/transfer/registry"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
)

// pullTuple is everything that tells one pull from another: where it goes
// (namespace, destination image, its labels, platform, snapshotter) and how
// it reaches the registry (reference, credentials, headers, hosts dir,
// scheme).
type pullTuple [10]string

const (
	fNamespace = iota
	fRef
	fUser
	fSecret
	fHeader
	fHostDir
	fScheme
	fDest
	fLabel
	fPlatform
)

type staticCreds struct{ user, secret string }

func (c staticCreds) GetCredentials(context.Context, string, string) (registry.Credentials, error) {
	return registry.Credentials{Username: c.user, Secret: c.secret}, nil
}

// key builds the pull the way CRI and ctr do, with containerd's own source
// and destination types, and keys it. ok is false when the tuple is not a
// pull that could be made.
func (p pullTuple) key(t *testing.T) (string, bool) {
	plat, err := platforms.Parse(p[fPlatform])
	if err != nil {
		return "", false
	}
	ctx := namespaces.WithNamespace(context.Background(), p[fNamespace])
	src, err := registry.NewOCIRegistry(ctx, p[fRef],
		registry.WithCredentials(staticCreds{p[fUser], p[fSecret]}),
		registry.WithHeaders(http.Header{"X-Fuzz": {p[fHeader]}}),
		registry.WithHostDir(p[fHostDir]),
		registry.WithDefaultScheme(p[fScheme]))
	if err != nil {
		return "", false
	}
	dst := image.NewStore(p[fDest],
		image.WithImageLabels(map[string]string{"fuzz": p[fLabel]}),
		image.WithPlatforms(plat),
		image.WithUnpack(plat, "overlayfs"))
	key, ok, err := Of(ctx, src, dst)
	if err != nil {
		// Such a source cannot describe itself (containerd's MarshalAny
		// refuses invalid UTF-8, for one): the pull goes unshared.
		return "", false
	}
	if !ok {
		t.Fatalf("registry pull %q cannot be keyed", p)
	}
	return key, true
}

// sameField reports whether two values of field f make the same pull.
func sameField(f int, a, b string) bool {
	switch f {
	case fRef:
		na, errA := reference.ParseDockerRef(a)
		nb, errB := reference.ParseDockerRef(b)
		if errA == nil && errB == nil {
			return na.String() == nb.String()
		}
	case fPlatform:
		pa, errA := platforms.Parse(a)
		pb, errB := platforms.Parse(b)
		if errA == nil && errB == nil {
			return platforms.Only(pa).Match(pb) && platforms.Only(pb).Match(pa) && pa.Variant == pb.Variant
		}
	}
	return a == b
}

// FuzzPullKey checks that the dedupe key is injective: two pulls that differ
// in anything that changes what is fetched, with what credentials, through
// which hosts or into what image never share a key, and two spellings of one
// pull do.
func FuzzPullKey(f *testing.F) {
	base := []string{"k8s.io", "busybox", "alice", "pw", "", "", "", "docker.io/library/busybox:latest", "", "linux/amd64"}
	type mutation struct {
		field uint8
		alt   string
	}
	for _, m := range []mutation{
		{fRef, "docker.io/library/busybox:latest"}, // same pull, spelled out
		{fRef, "busybox:1"},
		{fUser, "bob"},
		{fSecret, "pw2"},
		// Length prefixes: ("alice","pw") vs ("alic","epw").
		{fUser, "alic"},
		{fHeader, "v2"},
		{fHostDir, "/etc/containerd/certs.d"},
		{fScheme, "http"},
		{fNamespace, "default"},
		{fDest, "busybox"},
		{fLabel, "x"},
		{fPlatform, "linux/arm64"},
		{fPlatform, "linux/amd64/v2"},
	} {
		f.Add(base[0], base[1], base[2], base[3], base[4], base[5], base[6], base[7], base[8], base[9], m.field, m.alt)
	}
	f.Fuzz(func(t *testing.T, ns, ref, user, secret, header, hostDir, scheme, dest, label, platform string, field uint8, alt string) {
		a := pullTuple{ns, ref, user, secret, header, hostDir, scheme, dest, label, platform}
		fi := int(field) % len(a)
		b := a
		b[fi] = alt
		ka, okA := a.key(t)
		kb, okB := b.key(t)
		if !okA || !okB {
			return
		}
		same := sameField(fi, a[fi], alt)
		if same && ka != kb {
			t.Fatalf("one pull, two keys: field %d %q vs %q", fi, a[fi], alt)
		}
		if !same && ka == kb {
			t.Fatalf("two pulls share a key: field %d %q vs %q in %q", fi, a[fi], alt, a)
		}
	})
}
