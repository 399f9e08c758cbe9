package peers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/health"
)

// ErrNotFound is wrapped by Fetch's error when no peer served the blob:
// none was found within FindTimeout, or every one found failed. The
// caller goes to the registry.
var ErrNotFound = errors.New("peers: no peer served the blob")

// maxProviders bounds the providers a fetch looks for and tries.
const maxProviders = 20

// Fetch gets the blob dgst of size bytes (-1: whatever size the peer
// announces, still checked against the digest) from a peer and returns
// its bytes from offset on, and the ID of the peer that served it.
//
// It asks dgst's owner first (Owner over the live peers and this node),
// directly, when that is another node: the owner serves it from its
// store or streams its own download as it arrives. When the owner
// refuses (at once, if it expects no such download),
// fails, or is this node, the DHT's providers are tried.
//
// No byte reaches the caller unverified: the whole blob is spooled to
// a file in SpoolDir, hashed as it streams, and only a blob matching
// its digest and size is returned; the file goes away on Close. A peer
// that refuses, sends a wrong byte, stalls for ReadTimeout or breaks
// off is counted under its reason and the next provider is tried. The
// wait for providers adds up to FindTimeout at most; when it is over,
// or no provider is left, the error wraps ErrNotFound.
func (n *Node) Fetch(ctx context.Context, dgst digest.Digest, size, offset int64) (io.ReadCloser, string, error) {
	f, total, p, err := n.fetch(ctx, dgst, size)
	if err != nil {
		return nil, "", err
	}
	if offset < 0 || offset > total {
		f.Close()
		return nil, "", fmt.Errorf("peers: offset %d outside %s of %d bytes", offset, dgst, total)
	}
	return spooled{io.NewSectionReader(f, offset, total-offset), f}, p.String(), nil
}

// spooled is a verified blob in its spool file.
type spooled struct {
	*io.SectionReader
	f *os.File
}

func (s spooled) Close() error { return s.f.Close() }

// fetch spools dgst from its owner, else from the first provider that
// serves it right, and returns the file (positioned anywhere), the
// blob's size and the peer.
func (n *Node) fetch(ctx context.Context, dgst digest.Digest, size int64) (*os.File, int64, peer.ID, error) {
	c, err := blobCID(dgst)
	if err != nil {
		return nil, 0, "", err
	}
	f, err := os.CreateTemp(n.cfg.SpoolDir, "pullwise-peer-*")
	if err != nil {
		return nil, 0, "", fmt.Errorf("peers: spool: %w", err)
	}
	// Unlinked at once: the open file keeps the bytes, and nothing is
	// left behind however the caller or the process ends.
	os.Remove(f.Name())
	sp := &spool{f: f, h: dgst.Algorithm().Hash(), size: size}
	tried := map[peer.ID]bool{n.ID(): true} // this node never serves itself
	got, p, err := n.fetchOwner(ctx, dgst, sp, tried)
	if err == nil && p == "" {
		got, p, err = n.fetchProviders(ctx, c, dgst, sp, tried)
	}
	if err != nil {
		f.Close()
		return nil, 0, "", err
	}
	n.sh.fetched(dgst)
	return f, got, p, nil
}

// fetchOwner asks dgst's owner among the live peers and this node, when
// it is another node, first and directly: the owner serves it from its
// store, or streams its own download of it as it arrives. It returns the
// owner, or no peer and no error to go on with the DHT's providers. A
// refusal is the owner's ordinary miss, not a failure, and leaves the
// owner to be asked again should the DHT name it.
func (n *Node) fetchOwner(ctx context.Context, dgst digest.Digest, sp *spool, tried map[peer.ID]bool) (int64, peer.ID, error) {
	owner := Owner(dgst, append(n.Peers(), n.ID()))
	req := request{Digest: dgst, Follow: true}
	if owner == n.ID() {
		// This node coordinates dgst: a peer it told to fetch it is
		// followed, as the owner sends others to it; none, and this node
		// is the one to fetch it.
		owner, req.Sent = n.claims.claim(dgst, n.ID(), time.Now()), true
	}
	if owner == "" || tried[owner] {
		return 0, "", nil
	}
	n.sh.ask(dgst, 1)
	got, reason, err := n.try(ctx, peer.AddrInfo{ID: owner}, dgst, sp, req)
	var away *elsewhereError
	if errors.As(err, &away) && !tried[away.peer] {
		// The owner sent this node to the peer fetching dgst.
		coordinator := owner
		owner = away.peer
		got, reason, err = n.try(ctx, peer.AddrInfo{ID: owner}, dgst, sp, request{Digest: dgst, Follow: true, Sent: true})
		if errors.Is(err, errRefused) {
			// That peer no longer fetches it (a claim from an earlier
			// pull): this node takes the claim over, and fetches it.
			n.retakeClaim(ctx, coordinator, dgst, away.peer)
		}
	}
	n.sh.ask(dgst, -1)
	switch {
	case err == nil:
		return got, owner, nil
	case ctx.Err() != nil || reason == "":
		return 0, "", err
	case reason != ReasonRefused:
		tried[owner] = true
		n.stats.failed(reason)
	}
	return 0, "", nil
}

// fetchProviders spools dgst from the first provider the DHT names that
// serves it right.
func (n *Node) fetchProviders(ctx context.Context, c cid.Cid, dgst digest.Digest, sp *spool, tried map[peer.ID]bool) (int64, peer.ID, error) {
	findCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.lookups.Add(1)
	provs := n.dht.FindProvidersAsync(findCtx, c, maxProviders)
	wait := newBudget(n.cfg.FindTimeout)
	for {
		ai, ok := wait.next(ctx, provs)
		if !ok {
			break
		}
		if tried[ai.ID] {
			continue
		}
		tried[ai.ID] = true
		got, reason, err := n.try(ctx, ai, dgst, sp, request{Digest: dgst})
		if err == nil {
			return got, ai.ID, nil
		}
		if ctx.Err() != nil || reason == "" {
			return 0, "", err
		}
		n.stats.failed(reason)
	}
	if err := ctx.Err(); err != nil {
		return 0, "", err
	}
	n.stats.failed(ReasonNoPeer)
	return 0, "", fmt.Errorf("%w: %s (%d tried)", ErrNotFound, dgst, len(tried)-1)
}

// budget is the time a fetch may spend waiting for providers, in total:
// the clock runs only while it waits, not while it tries a peer.
type budget struct{ left time.Duration }

func newBudget(d time.Duration) *budget { return &budget{left: d} }

// next waits for the next provider, within what is left of the budget.
func (b *budget) next(ctx context.Context, provs <-chan peer.AddrInfo) (peer.AddrInfo, bool) {
	if b.left <= 0 {
		return peer.AddrInfo{}, false
	}
	start := time.Now()
	defer func() { b.left -= time.Since(start) }()
	t := time.NewTimer(b.left)
	defer t.Stop()
	select {
	case ai, ok := <-provs:
		return ai, ok
	case <-t.C:
	case <-ctx.Done():
	}
	return peer.AddrInfo{}, false
}

// try spools dgst from one peer into f (exchange), unless the node's
// health table (Config.Health) has the peer marked down, and tells the
// table how it went: a peer that sends wrong bytes, stalls or breaks off
// is skipped by every fetch on the node for the table's cooldown, as a
// failing registry host is, and `pullctl registries` lists it.
func (n *Node) try(ctx context.Context, ai peer.AddrInfo, dgst digest.Digest, sp *spool, req request) (int64, string, error) {
	admitted, err := n.cfg.Health.Admit(PeerKey(ai.ID), false)
	if err != nil {
		return 0, ReasonDown, err
	}
	resumed := sp.n > 0
	got, reason, err := n.exchange(ctx, ai, dgst, sp, req)
	if reason == ReasonCorrupt && resumed && sp.n == 0 {
		// The wrong bytes may be those an earlier peer left: this one is
		// asked again for the whole blob before it is blamed.
		got, reason, err = n.exchange(ctx, ai, dgst, sp, req)
	}
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	admitted.Report(ctx, outcome(ctx, reason, err), detail)
	return got, reason, err
}

// PeerKey is a peer in the node's health table.
func PeerKey(id peer.ID) health.Key { return health.Key{Scheme: "peer", Host: id.String()} }

// outcome is how a try went, for the health table.
func outcome(ctx context.Context, reason string, err error) health.Outcome {
	switch {
	case err == nil:
		return health.OK
	case ctx.Err() != nil || reason == "":
		// The caller gave up, or this node's own spool failed: it says
		// nothing of the peer.
		return health.Canceled
	case reason == ReasonRefused:
		return health.Answer
	case reason == ReasonStalled:
		return health.Timeout
	case reason == ReasonCorrupt:
		return health.ServerError
	}
	return health.Unreachable
}

// exchange spools dgst from one peer into f. It returns the blob's size, or
// the reason the peer failed with, or no reason when the failure is this
// node's own (its spool file) and no other peer would do better. With
// follow, the peer may keep the client waiting for the blob to start
// arriving, with a wait line at least every ReadTimeout, for startWait
// at the most.
func (n *Node) exchange(ctx context.Context, ai peer.AddrInfo, dgst digest.Digest, sp *spool, req request) (int64, string, error) {
	follow := req.Follow
	// A peer before this one that broke off left its bytes: this one is
	// asked for the rest (the server honours the offset).
	req.Offset = sp.n
	n.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
	dctx, cancel := context.WithTimeout(ctx, n.cfg.ReadTimeout)
	s, err := n.host.NewStream(dctx, ai.ID, BlobProtocol)
	cancel()
	if err != nil {
		return 0, ReasonDial, err
	}
	defer s.Reset()
	// A caller that gives up ends the reads at once.
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	s.SetWriteDeadline(time.Now().Add(n.cfg.ReadTimeout))
	if err := writeLine(s, req); err != nil {
		return 0, peerReason(err), err
	}
	body := &peerReader{s: s, timeout: n.cfg.ReadTimeout}
	r := bufio.NewReaderSize(body, chunk)
	resp, reason, err := n.header(r, follow)
	if err != nil {
		return 0, reason, err
	}
	switch {
	case resp.Error != "":
		err := fmt.Errorf("peer %s: %s: %w", ai.ID, resp.Error, errRefused)
		if p, perr := peer.Decode(resp.Peer); resp.Peer != "" && perr == nil && p != n.ID() {
			err = &elsewhereError{peer: p, err: err}
		}
		return 0, ReasonRefused, err
	case resp.Size < sp.n || (sp.size >= 0 && resp.Size != sp.size):
		return 0, ReasonCorrupt, fmt.Errorf("peer %s announced %d bytes, want %d", ai.ID, resp.Size, sp.size)
	}
	sp.size = resp.Size
	w, err := io.CopyN(io.MultiWriter(sp.f, sp.h), r, resp.Size-sp.n)
	sp.n += w
	if err != nil {
		if body.err == nil {
			return 0, "", fmt.Errorf("peers: spool: %w", err)
		}
		return 0, peerReason(body.err), err
	}
	if got := digest.NewDigest(dgst.Algorithm(), sp.h); got != dgst {
		// Which peer's bytes were wrong is not known: the next one
		// starts over.
		if err := sp.reset(dgst.Algorithm()); err != nil {
			return 0, "", err
		}
		return 0, ReasonCorrupt, fmt.Errorf("peer %s sent bytes of %s, want %s", ai.ID, got, dgst)
	}
	// Every byte is verified now, those an earlier peer sent among them.
	n.stats.fetched.Add(resp.Size)
	return resp.Size, "", nil
}

// spool is what peers sent of a blob so far, in an unlinked file, with
// its hash: a peer that breaks off or stalls leaves its bytes for the
// next peer to go on from, as containerd resumes a registry's body with
// a Range request. Only a whole blob whose hash matches is handed on.
type spool struct {
	f    *os.File
	h    hash.Hash
	n    int64 // bytes in f, all hashed
	size int64 // the blob's, once known; -1 before
}

// reset empties the spool for a peer that starts over.
func (s *spool) reset(alg digest.Algorithm) error {
	s.h, s.n = alg.Hash(), 0
	return rewind(s.f)
}

// header reads the peer's answer, after the wait lines a follow request
// may take for startWait at the most.
func (n *Node) header(r *bufio.Reader, follow bool) (response, string, error) {
	deadline := time.Now().Add(startWait + n.cfg.ReadTimeout)
	for {
		var resp response
		if err := readLine(r, &resp); err != nil {
			return resp, peerReason(err), err
		}
		if !resp.Wait {
			return resp, "", nil
		}
		if !follow || time.Now().After(deadline) {
			return resp, ReasonStalled, errors.New("the peer kept this node waiting")
		}
	}
}

// errRefused is wrapped by a peer's refusal to serve a blob.
var errRefused = errors.New("refused")

// retakeClaim tells the owner of dgst, coordinator, that the peer it
// named as fetching it, stale, refused: this node is the claimant now.
// A coordinator that is this node updates its own claims.
func (n *Node) retakeClaim(ctx context.Context, coordinator peer.ID, dgst digest.Digest, stale peer.ID) {
	if coordinator == n.ID() {
		n.claims.replace(dgst, stale, n.ID(), time.Now())
		return
	}
	s, err := n.host.NewStream(ctx, coordinator, BlobProtocol)
	if err != nil {
		return
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.ReadTimeout))
	if writeLine(s, request{Digest: dgst, Follow: true, Instead: stale.String()}) != nil {
		return
	}
	var resp response
	readLine(bufio.NewReaderSize(s, maxLine), &resp)
}

// elsewhereError is an owner's answer that another peer is fetching the
// blob from its registry, to be followed instead.
type elsewhereError struct {
	peer peer.ID
	err  error
}

func (e *elsewhereError) Error() string { return e.err.Error() + " (" + e.peer.String() + ")" }
func (e *elsewhereError) Unwrap() error { return e.err }

// rewind empties the spool file for another peer's bytes.
func rewind(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("peers: spool: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("peers: spool: %w", err)
	}
	return nil
}

// peerReader reads a peer's stream, each read bounded by timeout, and
// keeps the error the stream gave, to tell the peer's failures from the
// spool file's.
type peerReader struct {
	s       network.Stream
	timeout time.Duration
	err     error
}

func (p *peerReader) Read(b []byte) (int, error) {
	p.s.SetReadDeadline(time.Now().Add(p.timeout))
	k, err := p.s.Read(b)
	if err != nil {
		p.err = err
	}
	return k, err
}

// peerReason names how a peer's stream failed.
func peerReason(err error) string {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ReasonStalled
	}
	return ReasonBroken
}
