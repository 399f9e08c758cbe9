package peers

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

const (
	// startWait bounds the wait of a follow request for an expected
	// download to start; the wait also ends when the expectation is
	// done. The download may queue behind the pull's other layers.
	startWait = 2 * time.Minute
	// lingerAfterDone is how long a complete arrival outlives its
	// expectation, for followers that asked just before it ended.
	lingerAfterDone = 15 * time.Second
)

// errAbandoned ends the stream of a follower whose arrival will not
// complete: the client fails over to the next provider.
var errAbandoned = errors.New("peers: the arrival was abandoned")

// shares is what a node holds for its peers to follow: the blobs its
// pulls expect to fetch from a registry, and those arriving.
type shares struct {
	dir    string
	linger time.Duration

	mu      sync.Mutex
	closed  bool
	expect  map[digest.Digest]*expectation
	arr     map[digest.Digest]*arrival
	asking  map[digest.Digest]int // this node's fetches asking their owner
	waiting int                   // follow requests waiting for an arrival
	changed chan struct{}         // closed when an expectation or arrival comes or goes; nil: nobody waits
}

func newShares(dir string) *shares {
	return &shares{
		dir:    dir,
		linger: lingerAfterDone,
		expect: map[digest.Digest]*expectation{},
		arr:    map[digest.Digest]*arrival{},
		asking: map[digest.Digest]int{},
	}
}

// expectation is the pulls of this node that will fetch a blob.
type expectation struct {
	pulls int
	// elsewhere: this node got the blob from a peer, so no arrival
	// will come from its own download.
	elsewhere bool
}

// arrival is a blob's bytes as this node reads them from a registry, in
// a file in SpoolDir. An abandoned arrival in the map is a tombstone:
// its download goes on unshared, and followers are refused at once.
type arrival struct {
	dgst digest.Digest
	f    *os.File // nil for a tombstone; the pointer never changes
	size int64

	// guarded by shares.mu
	have      int64 // bytes in f, from 0
	writing   bool  // a body is open on it
	complete  bool  // have == size
	abandoned bool  // incomplete, and no more bytes will come
	ended     bool  // out of the map: no new follower
	readers   int
	fclosed   bool
	grew      chan struct{} // closed when have grows or it is abandoned; nil: nobody waits
	linger    *time.Timer
}

// notify wakes the requests waiting for an expectation or an arrival.
// Called with s.mu held.
func (s *shares) notify() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// wait returns what notify closes. Called with s.mu held.
func (s *shares) wait() <-chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// broadcast wakes a's followers. Called with shares.mu held.
func (a *arrival) broadcast() {
	if a.grew != nil {
		close(a.grew)
		a.grew = nil
	}
}

// release closes and removes a's file once nothing needs it: it left the
// map or was abandoned, and neither a body nor a follower holds it.
// Called with shares.mu held.
func (a *arrival) release() {
	if a.f == nil || a.fclosed || !(a.ended || a.abandoned) || a.writing || a.readers > 0 {
		return
	}
	a.fclosed = true
	a.f.Close()
	os.Remove(a.f.Name())
}

// abandon marks a as never completing, unless it is complete already.
// Called with s.mu held.
func (s *shares) abandon(a *arrival) {
	if !a.complete {
		a.abandoned = true
	}
	a.broadcast()
	a.release()
	s.notify()
}

// end takes a out of the map. Called with s.mu held.
func (s *shares) end(a *arrival) {
	if s.arr[a.dgst] == a {
		delete(s.arr, a.dgst)
	}
	if a.linger != nil {
		a.linger.Stop()
		a.linger = nil
	}
	a.ended = true
	s.abandon(a)
}

// Expect tells the node that one of its pulls will fetch dgsts from a
// registry: the caller learns them from the image manifest, before any
// layer is asked for. Until done is called (when the pull ends, however
// it ends), a peer that asks for one of them waits for its download to
// start and follows it. Expectations of several pulls stack; done is
// safe to call more than once.
func (n *Node) Expect(dgsts ...digest.Digest) (done func()) {
	s := n.sh
	ds := append([]digest.Digest(nil), dgsts...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return func() {}
	}
	for _, d := range ds {
		e := s.expect[d]
		if e == nil {
			e = &expectation{}
			s.expect[d] = e
		}
		e.pulls++
		// A pull again: a complete arrival stays while it lasts.
		if a := s.arr[d]; a != nil && a.linger != nil {
			a.linger.Stop()
			a.linger = nil
		}
	}
	s.notify()
	var once sync.Once
	return func() { once.Do(func() { n.unexpect(ds) }) }
}

// unexpect ends one pull's expectation of ds. An arrival no pull expects
// any more goes: at once when incomplete or when the store now holds its
// blob, lingerAfterDone later when complete.
func (n *Node) unexpect(ds []digest.Digest) {
	stored := map[digest.Digest]bool{}
	for _, d := range ds {
		stored[d] = n.holds(n.ctx, d)
	}
	s := n.sh
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, d := range ds {
		e := s.expect[d]
		if e == nil {
			continue
		}
		if e.pulls--; e.pulls > 0 {
			continue
		}
		delete(s.expect, d)
		a := s.arr[d]
		switch {
		case a == nil:
		case a.complete && !stored[d]:
			var t *time.Timer
			t = time.AfterFunc(s.linger, func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				if a.linger == t {
					s.end(a)
				}
			})
			a.linger = t
		default:
			s.end(a)
		}
	}
	s.notify()
}

// Arriving returns where the bytes of blob dgst go as this node reads
// them from a registry, from offset on (0, or where a broken body
// resumes); size is the blob's, -1 unknown. Its Write never fails and
// never waits on a peer: sharing is best effort, and when the bytes
// cannot be kept (no pull expects dgst, size unknown, another body is
// writing it, a resume from another offset than the bytes kept, a full
// disk) they are discarded. A resume from exactly the bytes kept goes on
// with the same arrival, which is complete once size bytes arrived. An
// incomplete arrival whose body closed waits for a resume until its
// expectation is done.
func (n *Node) Arriving(dgst digest.Digest, offset, size int64) io.WriteCloser {
	s := n.sh
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.expect[dgst] == nil {
		return discard{}
	}
	a := s.arr[dgst]
	switch {
	case a == nil && offset == 0 && size > 0:
		f, err := os.CreateTemp(s.dir, "pullwise-arriving-*")
		if err != nil {
			s.arr[dgst] = &arrival{dgst: dgst, abandoned: true}
			s.notify()
			return discard{}
		}
		a = &arrival{dgst: dgst, f: f, size: size}
		s.arr[dgst] = a
		s.notify()
	case a == nil:
		// Nothing kept to go on from: followers go elsewhere at once.
		s.arr[dgst] = &arrival{dgst: dgst, abandoned: true}
		s.notify()
		return discard{}
	case a.abandoned || a.complete || a.writing:
		return discard{}
	case offset != a.have || size != a.size:
		s.abandon(a)
		return discard{}
	}
	a.writing = true
	return &arrivalWriter{s: s, a: a, pos: offset}
}

// arrivalWriter appends one body's bytes to its arrival.
type arrivalWriter struct {
	s      *shares
	a      *arrival
	pos    int64
	off    bool // discarding from now on
	closed bool
}

func (w *arrivalWriter) Write(p []byte) (int, error) {
	if w.off || len(p) == 0 {
		return len(p), nil
	}
	var err error
	k := 0
	if w.pos+int64(len(p)) > w.a.size {
		err = errors.New("more bytes than the blob's size")
	} else {
		// Outside the lock: only this body writes the file, and
		// followers read only the bytes counted in have.
		k, err = w.a.f.WriteAt(p, w.pos)
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if err != nil || w.a.abandoned {
		w.off = true
		w.s.abandon(w.a)
		return len(p), nil
	}
	w.pos += int64(k)
	w.a.have = w.pos
	w.a.complete = w.a.have == w.a.size
	w.a.broadcast()
	return len(p), nil
}

func (w *arrivalWriter) Close() error {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	w.a.writing = false
	w.a.release()
	return nil
}

// discard is the arrival of bytes nobody keeps.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Close() error                { return nil }

// stored drops the complete arrival of dgst, now that the store serves
// the blob.
func (s *shares) stored(dgst digest.Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.arr[dgst]; a != nil && a.complete {
		s.end(a)
	}
}

// fetched notes that this node got dgst from a peer: requests waiting
// for its download to start give up.
func (s *shares) fetched(dgst digest.Digest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.expect[dgst]; e != nil {
		e.elsewhere = true
		s.notify()
	}
}

// has reports whether a pull of this node expects dgst or it is
// arriving.
func (s *shares) has(dgst digest.Digest) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expect[dgst] != nil || s.arr[dgst] != nil
}

// ask counts this node's fetches of dgst asking its owner (by +1, then
// -1): while one does, this node is not downloading dgst, and a follow
// request that would wait for that download is refused, so two nodes
// that each see the other as owner never wait for each other.
func (s *shares) ask(dgst digest.Digest, by int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asking[dgst] += by; s.asking[dgst] <= 0 {
		delete(s.asking, dgst)
	}
	s.notify()
}

// close ends every arrival and removes every file, readers or not.
func (s *shares) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, a := range s.arr {
		s.end(a)
		if a.f != nil && !a.fclosed {
			a.fclosed = true
			a.f.Close()
			os.Remove(a.f.Name())
		}
	}
	clear(s.expect)
	clear(s.asking)
	s.notify()
}

// follower reads an arrival from pos as it grows, each wait for more
// bytes bounded by timeout and ctx.
type follower struct {
	s       *shares
	a       *arrival
	ctx     context.Context
	pos     int64
	timeout time.Duration
}

func (r *follower) Read(p []byte) (int, error) {
	if r.pos >= r.a.size {
		return 0, io.EOF
	}
	for {
		r.s.mu.Lock()
		have, abandoned := r.a.have, r.a.abandoned
		var grew <-chan struct{}
		if have <= r.pos && !abandoned {
			if r.a.grew == nil {
				r.a.grew = make(chan struct{})
			}
			grew = r.a.grew
		}
		r.s.mu.Unlock()
		if have > r.pos {
			k, err := r.a.f.ReadAt(p[:min(int64(len(p)), have-r.pos)], r.pos)
			r.pos += int64(k)
			if err == io.EOF && k > 0 {
				err = nil
			}
			return k, err
		}
		if abandoned {
			return 0, errAbandoned
		}
		t := time.NewTimer(r.timeout)
		select {
		case <-grew:
			t.Stop()
		case <-t.C:
			return 0, os.ErrDeadlineExceeded
		case <-r.ctx.Done():
			t.Stop()
			return 0, r.ctx.Err()
		}
	}
}

// leave lets go of a follower's arrival.
func (s *shares) leave(a *arrival) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.readers--
	a.release()
}
