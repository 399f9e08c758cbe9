package policy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criauth"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/source"
)

// RegistryResolver returns a Deps.Resolve that asks the registry through
// containerd's resolver with the node's hosts.toml and memory of failing
// hosts (registries) and the pull's own credentials: one HEAD for a tag,
// as a pull's resolve would.
func RegistryResolver(registries func() (hostDirs []string, table *health.Table)) func(context.Context, string, *runtime.AuthConfig) (digest.Digest, string, time.Duration, error) {
	return func(ctx context.Context, ref string, auth *runtime.AuthConfig) (digest.Digest, string, time.Duration, error) {
		rec := &source.Recorder{}
		dirs, table := registries()
		r := source.NewResolver(ctx, source.Hosts{Dirs: dirs, Credentials: credentials(auth), Health: table}, rec)
		_, desc, err := r.Resolve(ctx, ref)
		if err != nil {
			if f := rec.Failure(ref); f != nil && ctx.Err() == nil {
				err = f
			}
			return "", "", rec.RetryAfter(), fmt.Errorf("resolve %s: %w", ref, err)
		}
		return desc.Digest, rec.Result(refPart(ref)).Source, 0, nil
	}
}

// refPart is the tag or digest of a normalized reference.
func refPart(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[i+1:]
	}
	return ref[strings.LastIndex(ref, ":")+1:]
}

// credentials turns CRI's AuthConfig into host credentials as CRI's own
// pull reads them (criauth), so the digest check asks each host what the
// pull would.
func credentials(auth *runtime.AuthConfig) func(string) (string, string, error) {
	if auth == nil {
		return nil
	}
	return func(host string) (string, string, error) { return criauth.Parse(auth, host) }
}
