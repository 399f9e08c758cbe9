package peers

import (
	"bufio"
	"fmt"
	"io"
	"time"

	"github.com/containerd/log"
	"github.com/libp2p/go-libp2p/core/network"
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

func (n *Node) serveBlob(s network.Stream) error {
	// A client that goes quiet, before asking or while it is sent the
	// body, is dropped after ReadTimeout rather than holding the stream.
	s.SetReadDeadline(time.Now().Add(n.cfg.ReadTimeout))
	var req request
	if err := readLine(bufio.NewReaderSize(s, maxLine), &req); err != nil {
		return err
	}
	ra, err := n.store.ReaderAt(n.ctx, ocispec.Descriptor{Digest: req.Digest})
	if err != nil {
		return n.answer(s, response{Error: errNotHeld})
	}
	defer ra.Close()
	size := ra.Size()
	if req.Offset < 0 || req.Offset > size {
		return n.answer(s, response{Error: fmt.Sprintf("offset %d outside a blob of %d bytes", req.Offset, size)})
	}
	if err := n.answer(s, response{Size: size}); err != nil {
		return err
	}
	body := io.NewSectionReader(ra, req.Offset, size-req.Offset)
	buf := make([]byte, chunk)
	for {
		k, rerr := body.Read(buf)
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

func (n *Node) answer(s network.Stream, r response) error {
	s.SetWriteDeadline(time.Now().Add(n.cfg.ReadTimeout))
	return writeLine(s, r)
}
