package source

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/typeurl/v2"
)

// Streams is a StreamCreator whose streams stay in this process. It keeps
// the one stream a source asks for: registry sources describe their
// credentials callback as a stream, and serving it in process is how a
// source built from that description asks for credentials.
type Streams struct {
	mu sync.Mutex
	s  *Pipe
}

func (l *Streams) Create(context.Context, string) (streaming.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return nil, errors.New("one local stream only")
	}
	l.s = newPipe()
	return l.s.theirs, nil
}

// Stream returns the stream a source asked for, or nil.
func (l *Streams) Stream() *Pipe {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}

// Pipe joins two stream ends in memory.
type Pipe struct {
	// Ours is this process's end; the source holds the other.
	Ours, theirs *end
	closed       chan struct{}
	once         sync.Once
}

// end is one side of a Pipe.
type end struct {
	p    *Pipe
	in   chan typeurl.Any
	peer *end
}

func newPipe() *Pipe {
	p := &Pipe{closed: make(chan struct{})}
	p.Ours = &end{p: p, in: make(chan typeurl.Any)}
	p.theirs = &end{p: p, in: make(chan typeurl.Any)}
	p.Ours.peer, p.theirs.peer = p.theirs, p.Ours
	return p
}

// Close ends both ends: the source's goroutine serving it returns.
func (p *Pipe) Close() error {
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
