// Package policy decides whether a pull goes to the registry, by pull
// policy, including IfNewerNotPresent (KEP-5497): pull only when the digest
// the registry has for a tag differs from the local one, and keep pods
// starting on the local copy when the registry cannot be reached. The check
// runs in the runtime, through the node's own resolver, so hosts.toml
// mirrors and credentials apply to it as to pulls.
package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Policy is when to pull.
type Policy int

const (
	Always Policy = iota
	IfNotPresent
	IfNewerNotPresent
	Never
)

func (p Policy) String() string {
	names := [...]string{"Always", "IfNotPresent", "IfNewerNotPresent", "Never"}
	if p < 0 || int(p) >= len(names) {
		return fmt.Sprintf("Policy(%d)", int(p))
	}
	return names[p]
}

// Reasons for a decision, as the Pullwise PullImage RPC reports them.
const (
	ReasonNotPresent          = "not-present"                     // no local image: pulled
	ReasonRemoteChanged       = "remote-changed"                  // registry digest differs: pulled
	ReasonUpToDate            = "up-to-date"                      // registry digest is the local one: not pulled
	ReasonRegistryUnavailable = "registry-unavailable-used-local" // registry unreachable: local used
	ReasonPolicyNever         = "policy-never"                    // Never: local used
	ReasonPresent             = "present"                         // IfNotPresent with a local image
	ReasonPolicyAlways        = "policy-always"                   // Always: pulled
)

// Decision is what a pull did and why.
type Decision struct {
	ImageRef     string // image ID
	Pulled       bool
	Reason       string
	LocalDigest  string
	RemoteDigest string
	PullSource   string // host that answered the digest check, when asked
	Warnings     []string
}

// Local is an image the node has under a name.
type Local struct {
	ImageID string
	Target  digest.Digest // manifest or index digest the name points to
}

// Deps is what a Decider works with.
type Deps struct {
	// Local finds the image a reference names on the node.
	Local func(ctx context.Context, ref string) (Local, bool, error)
	// Resolve asks the registry (through mirrors, with auth) for the digest
	// ref points to, once. It returns the source as the answering host knows
	// it, and the Retry-After the registry asked for, if any.
	Resolve func(ctx context.Context, ref string, auth *runtime.AuthConfig) (d digest.Digest, source string, retryAfter time.Duration, err error)
	// Pull pulls like CRI PullImage and returns the image ID.
	Pull func(ctx context.Context, req *runtime.PullImageRequest) (string, error)
	// Reassert writes the pull-source labels again after a check that found
	// the image up to date; the image store is not rewritten otherwise.
	Reassert func(ctx context.Context, ref, imageID, source string)
}

// Decider applies pull policies.
type Decider struct {
	deps  Deps
	retry Retry
}

// New returns a Decider.
func New(deps Deps, retry Retry) *Decider {
	return &Decider{deps: deps, retry: retry}
}

// With returns a Decider that pulls with pull: each entry point (a CRI
// interceptor, the Pullwise API) reaches CRI its own way.
func (d *Decider) With(pull func(context.Context, *runtime.PullImageRequest) (string, error)) *Decider {
	c := *d
	c.deps.Pull = pull
	return &c
}

// Pull applies policy p to req.
func (d *Decider) Pull(ctx context.Context, req *runtime.PullImageRequest, p Policy) (*Decision, error) {
	raw := req.GetImage().GetImage()
	named, err := reference.ParseDockerRef(raw)
	if err != nil {
		return nil, fmt.Errorf("parse image reference %q: %w", raw, errors.Join(err, errdefs.ErrInvalidArgument))
	}
	ref := named.String()
	local, present, err := d.deps.Local(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", ref, err)
	}
	dec := &Decision{}
	if present {
		dec.ImageRef, dec.LocalDigest = local.ImageID, local.Target.String()
	}
	logger := log.G(ctx).WithField("image", ref).WithField("policy", p.String())

	switch {
	case p == Never:
		if !present {
			return nil, fmt.Errorf("image %q is not present and the pull policy is Never: %w", ref, errdefs.ErrFailedPrecondition)
		}
		dec.Reason = ReasonPolicyNever
		return dec, nil
	case p == IfNotPresent && present:
		dec.Reason = ReasonPresent
		return dec, nil
	case !present:
		dec.Reason = ReasonNotPresent
		return d.pull(ctx, req, dec)
	case p == Always:
		dec.Reason = ReasonPolicyAlways
		return d.pull(ctx, req, dec)
	}

	// IfNewerNotPresent with a local image. A digest reference cannot point
	// elsewhere: there is nothing to ask.
	if _, ok := named.(reference.Digested); ok {
		dec.Reason, dec.RemoteDigest = ReasonUpToDate, dec.LocalDigest
		return dec, nil
	}
	// A tag: ask the registry for its digest.
	remote, source, err := d.resolve(ctx, ref, req.GetAuth())
	if err != nil {
		if !unavailable(err) {
			return nil, fmt.Errorf("check %s for a newer image: %w", ref, err)
		}
		dec.Reason = ReasonRegistryUnavailable
		warning := fmt.Sprintf("registry unavailable, using the local image %s (%s): %v", ref, dec.LocalDigest, err)
		dec.Warnings = append(dec.Warnings, warning)
		logger.WithFields(log.Fields{"local": dec.LocalDigest, "reason": dec.Reason}).Warn(warning)
		return dec, nil
	}
	dec.RemoteDigest = remote.String()
	if remote == local.Target {
		dec.Reason, dec.PullSource = ReasonUpToDate, source
		d.deps.Reassert(ctx, ref, dec.ImageRef, source)
		logger.WithFields(log.Fields{"local": dec.LocalDigest, "remote": dec.RemoteDigest, "reason": dec.Reason}).
			Info("image is up to date with the registry; not pulling")
		return dec, nil
	}
	dec.Reason = ReasonRemoteChanged
	logger.WithFields(log.Fields{"local": dec.LocalDigest, "remote": dec.RemoteDigest, "reason": dec.Reason}).
		Info("registry has a newer image; pulling")
	return d.pull(ctx, req, dec)
}

func (d *Decider) pull(ctx context.Context, req *runtime.PullImageRequest, dec *Decision) (*Decision, error) {
	id, err := d.deps.Pull(ctx, req)
	if err != nil {
		return nil, err
	}
	dec.ImageRef, dec.Pulled = id, true
	return dec, nil
}
