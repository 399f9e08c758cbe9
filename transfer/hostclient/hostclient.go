package hostclient

import (
	"io"
	"net/http"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// Endpoint is one registry host of a pull, as hosts.toml lists it.
type Endpoint struct {
	Key  health.Key
	Role string // RoleMirror or RoleUpstream
	// Later are the hosts containerd tries after this one for the same
	// request; a marked host is skipped only if one of them may be used.
	Later []health.Key
}

// Roles of a host in a pull's host list: hosts.toml lists mirrors first and
// the server last. The node's peers (transfer/peers), when on, come before
// them all, for blobs only.
const (
	RolePeer     = "peer"
	RoleMirror   = "mirror"
	RoleUpstream = "upstream"
)

// PeerHeader is the response header in which a host that fronts several
// servers, the node's peers, names the one that served a blob; its bytes
// are counted for PeerPrefix+name.
const (
	PeerHeader = "Pullwise-Peer"
	PeerPrefix = "peer/"
)

// Node is what every pull on the node shares. Each part may be nil.
type Node struct {
	Health    *health.Table // nil: no memory, no timeouts
	Downloads *lane.Lane    // nil: containerd's download limiter applies
	Link      *lane.Link    // nil: bodies never pause for other pulls'
	Arrivals  Arrivals      // nil: blob bytes are shared with no one
}

// Arrivals get the bytes of every blob body as it is read, for the node's
// peers to follow while it arrives (transfer/peers).
type Arrivals interface {
	// Arriving returns where the bytes of blob dgst go from offset on;
	// size is the blob's, -1 unknown. Its Write must not block the
	// download for long, and its errors are ignored: sharing is best
	// effort. Close ends the body, complete or not.
	Arriving(dgst digest.Digest, offset, size int64) io.WriteCloser
}

// Attempt is one manifest or blob request to one host and what came of it.
type Attempt struct {
	Kind     string // "manifests" or "blobs"
	Ref      string // the tag or digest
	Endpoint Endpoint
	Outcome  health.Outcome
	Status   int    // HTTP status; 0 when there was no response
	Detail   string // status line or error, never a URL
}

// Observer learns what the hosts of one pull answered. Its methods run on
// the fetching goroutines: they must be quick and must not block.
type Observer interface {
	// IsConfig reports d is an image config blob, which takes no download
	// place: it is a few KiB, and containerd asks for no layer before it
	// has it.
	IsConfig(d digest.Digest) bool
	// Attempted learns how a manifest or blob request went.
	Attempted(a Attempt)
	// AskedToWait learns the Retry-After of an error answer.
	AskedToWait(d time.Duration)
	// Manifest learns a manifest answer below 400 for ref in repo from
	// host; get says it has a body. It returns the func that gets the
	// body once read whole (empty past maxManifest), or nil.
	Manifest(host, repo, ref string, get bool) (body func([]byte))
	// Blob learns a blob GET answered below 400, and returns the func its
	// bytes are counted with as they are read.
	Blob(host, dgst string) (add func(n int64))
}

// Wrap returns c with its transport going through the host's client.
func Wrap(c *http.Client, node Node, ep Endpoint, obs Observer) *http.Client {
	if c == nil {
		c = &http.Client{}
	}
	wrapped := *c
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	wrapped.Transport = &transport{next: next, node: node, ep: ep, obs: obs}
	return &wrapped
}
