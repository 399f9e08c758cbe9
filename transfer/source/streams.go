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

// Pipe joins two stream ends in memory: the source holds one end and
// serves requests on it; this process asks through Ask.
type Pipe struct {
	ours, theirs *end
	closed       chan struct{}
	once         sync.Once

	mu sync.Mutex
	// pending counts requests the source took and has not answered.
	pending int
	// dropped is signalled when the source goes back to waiting for a
	// request without answering the one it took.
	dropped chan struct{}
}

// end is one side of a Pipe.
type end struct {
	p    *Pipe
	in   chan typeurl.Any
	peer *end
}

func newPipe() *Pipe {
	p := &Pipe{closed: make(chan struct{}), dropped: make(chan struct{}, 1)}
	p.ours = &end{p: p, in: make(chan typeurl.Any)}
	p.theirs = &end{p: p, in: make(chan typeurl.Any)}
	p.ours.peer, p.theirs.peer = p.theirs, p.ours
	return p
}

// errNoAnswer is a request the source dropped.
var errNoAnswer = errors.New("the source dropped the request without an answer")

// Ask sends req to the source and returns its answer. containerd's registry
// source serves one request at a time and, when it cannot answer one (its
// credential helper failed, the answer does not encode), logs and waits for
// the next without a word; that wait is how a dropped request shows, so
// Ask fails at once instead of waiting forever. A source that is not asked
// to the end (ctx ended) is not asked again: a late answer must not be
// taken for the answer to another request.
func (p *Pipe) Ask(ctx context.Context, req typeurl.Any) (typeurl.Any, error) {
	select {
	case <-p.dropped: // left over from a request that was answered late
	default:
	}
	select {
	case p.theirs.in <- req:
	case <-p.closed:
		return nil, io.ErrClosedPipe
	case <-ctx.Done():
		p.Close()
		return nil, ctx.Err()
	}
	select {
	case a := <-p.ours.in:
		return a, nil
	case <-p.dropped:
		return nil, errNoAnswer
	case <-p.closed:
		return nil, io.EOF
	case <-ctx.Done():
		p.Close()
		return nil, ctx.Err()
	}
}

// Close ends both ends: the source's goroutine serving it returns.
func (p *Pipe) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

func (e *end) Send(a typeurl.Any) error {
	if e == e.p.theirs {
		e.p.mu.Lock()
		e.p.pending = max(e.p.pending-1, 0)
		e.p.mu.Unlock()
	}
	select {
	case e.peer.in <- a:
		return nil
	case <-e.p.closed:
		return io.ErrClosedPipe
	}
}

func (e *end) Recv() (typeurl.Any, error) {
	if e == e.p.theirs {
		e.p.mu.Lock()
		if e.p.pending > 0 {
			e.p.pending = 0
			select {
			case e.p.dropped <- struct{}{}:
			default:
			}
		}
		e.p.mu.Unlock()
	}
	select {
	case a := <-e.in:
		if e == e.p.theirs {
			e.p.mu.Lock()
			e.p.pending++
			e.p.mu.Unlock()
		}
		return a, nil
	case <-e.p.closed:
		return nil, io.EOF
	}
}

func (e *end) Close() error { return e.p.Close() }
