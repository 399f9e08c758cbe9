package peers

import (
	"bufio"
	"fmt"
	"io"
	"time"

	"github.com/containerd/log"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// serve answers one blob request: the header, then the bytes from the
// requested offset, under the node's upload limit. The store is asked on
// every request, so a blob garbage collection removed is refused at once
// even while a record in the DHT still names this node.
func (n *Node) serve(s network.Stream) {
	if !n.enter() {
		s.Reset()
		return
	}
	defer n.wg.Done()
	if err := n.serveBlob(s); err != nil {
		log.G(n.ctx).WithError(err).Debugf("peers: serving %s", s.Conn().RemotePeer())
		s.Reset()
		return
	}
	s.Close()
}

// serveBlob serves, in order: the blob from the store; its arrival, as
// it grows; for a follow request, the arrival once it starts, when a
// pull of this node expects the blob, or once an expectation or arrival
// appears. Anything else is refused at once, and the claims decide.
func (n *Node) serveBlob(s network.Stream) error {
	// A client that goes quiet, before asking or while it is sent the
	// body, is dropped after ReadTimeout rather than holding the stream.
	s.SetReadDeadline(time.Now().Add(n.cfg.ReadTimeout))
	var req request
	if err := readLine(bufio.NewReaderSize(s, maxLine), &req); err != nil {
		return err
	}
	if ra, err := n.store.ReaderAt(n.ctx, ocispec.Descriptor{Digest: req.Digest}); err == nil {
		defer ra.Close()
		n.sh.stored(req.Digest)
		return n.send(s, req, ra.Size(), func(off int64) io.Reader {
			return io.NewSectionReader(ra, off, ra.Size()-off)
		})
	}
	from := s.Conn().RemotePeer()
	if req.Instead != "" {
		if stale, err := peer.Decode(req.Instead); err == nil {
			n.claims.replace(req.Digest, stale, from, time.Now())
		}
		return n.answer(s, response{Error: errNotHeld})
	}
	if req.Follow && !n.sh.has(req.Digest) {
		// Another peer was told to fetch it: no need to wait here.
		if p := n.claims.holder(req.Digest, time.Now()); p != "" && p != from {
			return n.answer(s, response{Error: errElsewhere, Peer: p.String()})
		}
	}
	a, err := n.awaitArrival(s, req)
	if err != nil {
		return err
	}
	if a == nil {
		// Asked as the digest's owner, with nothing of it here: the
		// first peer to ask fetches it, the others follow that one.
		if req.Follow && Owner(req.Digest, append(n.Peers(), n.ID())) == n.ID() {
			if p := n.claims.claim(req.Digest, from, time.Now()); p != "" {
				return n.answer(s, response{Error: errElsewhere, Peer: p.String()})
			}
		}
		n.stats.refused.Add(1)
		return n.answer(s, response{Error: errNotHeld})
	}
	defer n.sh.leave(a)
	err = n.send(s, req, a.size, func(off int64) io.Reader {
		return &follower{s: n.sh, a: a, ctx: n.ctx, pos: off, timeout: n.cfg.ReadTimeout}
	})
	if err == nil {
		n.stats.servedArriving.Add(1)
	}
	return err
}

// send answers with the blob's size and sends its bytes from the
// request's offset, read from body(offset).
func (n *Node) send(s network.Stream, req request, size int64, body func(offset int64) io.Reader) error {
	if req.Offset < 0 || req.Offset > size {
		return n.answer(s, response{Error: fmt.Sprintf("offset %d outside a blob of %d bytes", req.Offset, size)})
	}
	if err := n.answer(s, response{Size: size}); err != nil {
		return err
	}
	r := body(req.Offset)
	buf := make([]byte, chunk)
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			if err := n.up.wait(n.ctx, k); err != nil {
				return err
			}
			s.SetWriteDeadline(time.Now().Add(n.cfg.ReadTimeout))
			w, err := s.Write(buf[:k])
			n.stats.served.Add(int64(w))
			if err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// awaitArrival returns the arrival of the requested blob, counted as
// followed, or nil to refuse. A follow request for a blob a pull of this
// node expects waits, bounded, for its download to start: until the
// expectation is done or startWait has passed, with a wait line every
// second (ReadTimeout/3 if shorter) so that the client knows this node is
// alive. It is refused at once when nothing here expects the blob, when
// this node got it from a peer, or when it is itself asking the blob's
// owner (unless the owner sent the client): then it is not downloading it.
func (n *Node) awaitArrival(s network.Stream, req request) (*arrival, error) {
	sh := n.sh
	start := time.Now()
	beat := start
	// Often enough for a client whose ReadTimeout is shorter than ours.
	every := min(n.cfg.ReadTimeout/3, time.Second)
	sh.mu.Lock()
	sh.waiting++
	sh.mu.Unlock()
	defer func() {
		sh.mu.Lock()
		sh.waiting--
		sh.mu.Unlock()
	}()
	for {
		sh.mu.Lock()
		if a := sh.arr[req.Digest]; a != nil && !a.abandoned && !sh.closed {
			a.readers++
			sh.mu.Unlock()
			return a, nil
		}
		// Nothing expected: refused at once, for the claims to decide
		// (an owner that has not read its manifest yet follows the
		// claimant like any other peer).
		until := start
		e := sh.expect[req.Digest]
		if e != nil {
			until = start.Add(startWait)
		}
		if sh.closed || !req.Follow || sh.arr[req.Digest] != nil || (e != nil && (e.elsewhere || (sh.asking[req.Digest] > 0 && !req.Sent))) || !time.Now().Before(until) {
			sh.mu.Unlock()
			return nil, nil
		}
		changed := sh.wait()
		sh.mu.Unlock()
		t := time.NewTimer(min(time.Until(until), time.Until(beat.Add(every))))
		select {
		case <-changed:
		case <-t.C:
		case <-n.ctx.Done():
			t.Stop()
			return nil, n.ctx.Err()
		}
		t.Stop()
		if time.Since(beat) >= every {
			if err := n.answer(s, response{Wait: true}); err != nil {
				return nil, err
			}
			beat = time.Now()
		}
	}
}

func (n *Node) answer(s network.Stream, r response) error {
	s.SetWriteDeadline(time.Now().Add(n.cfg.ReadTimeout))
	return writeLine(s, r)
}
