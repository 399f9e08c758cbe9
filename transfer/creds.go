package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/typeurl/v2"
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
	streams := &localStreams{}
	if _, err := src.MarshalAny(ctx, streams); err != nil {
		return "", false, fmt.Errorf("describe %s: %w", ref, err)
	}
	s := streams.get()
	if s == nil {
		return "anonymous", true, nil
	}
	defer s.Close()
	req, err := typeurl.MarshalAny(&transfertypes.AuthRequest{Host: host, Reference: ref})
	if err != nil {
		return "", false, err
	}
	if err := s.ours.Send(req); err != nil {
		return "", false, fmt.Errorf("ask credentials for %s: %w", host, err)
	}
	a, err := s.ours.Recv()
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

// localStreams is a StreamCreator whose streams stay in this process. It
// keeps the one stream a source asks for.
type localStreams struct {
	mu sync.Mutex
	s  *pipe
}

func (l *localStreams) Create(context.Context, string) (streaming.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return nil, errors.New("one local stream only")
	}
	l.s = newPipe()
	return l.s.theirs, nil
}

func (l *localStreams) get() *pipe {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}

// pipe joins two stream ends in memory.
type pipe struct {
	ours, theirs *end
	closed       chan struct{}
	once         sync.Once
}

type end struct {
	p    *pipe
	in   chan typeurl.Any
	peer *end
}

func newPipe() *pipe {
	p := &pipe{closed: make(chan struct{})}
	p.ours = &end{p: p, in: make(chan typeurl.Any)}
	p.theirs = &end{p: p, in: make(chan typeurl.Any)}
	p.ours.peer, p.theirs.peer = p.theirs, p.ours
	return p
}

func (p *pipe) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

func (e *end) Send(a typeurl.Any) error {
	select {
	case e.peer.in <- a:
		return nil
	case <-e.p.closed:
		return io.ErrClosedPipe
	}
}

func (e *end) Recv() (typeurl.Any, error) {
	select {
	case a := <-e.in:
		return a, nil
	case <-e.p.closed:
		return nil, io.EOF
	}
}

func (e *end) Close() error { return e.p.Close() }
