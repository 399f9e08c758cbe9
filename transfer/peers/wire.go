package peers

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/opencontainers/go-digest"
)

// BlobProtocol is the libp2p protocol a node serves blobs on. The wire
// format (see the package doc) is one JSON line each way, then raw bytes.
const BlobProtocol protocol.ID = "/pullwise/blob/1"

// maxLine bounds a header line, so a peer cannot make the other side
// buffer without end before a single blob byte.
const maxLine = 1024

// request asks for the bytes of a blob from Offset to its end. Follow
// asks the blob's owner to wait for its own download of the blob and
// stream it as it arrives; the client then takes wait lines.
type request struct {
	Digest digest.Digest `json:"digest"`
	Offset int64         `json:"offset"`
	Follow bool          `json:"follow,omitempty"`
	// Sent says the blob's owner sent the client here, to the peer it
	// told to fetch the blob: this node will download it, even if it is
	// still hearing so from the owner.
	Sent bool `json:"sent,omitempty"`
	// Instead, from a client the owner sent to a peer that refused,
	// names that peer: the owner makes the client the one fetching the
	// blob in its place.
	Instead string `json:"instead,omitempty"`
}

// response precedes the body: the blob's full size, or why there is no
// body. Size-Offset bytes follow a response without Error. A response
// with Wait says only that the server is still waiting for the blob to
// start arriving (a follow request's alone): another line follows.
type response struct {
	Size  int64  `json:"size"`
	Error string `json:"error,omitempty"`
	Wait  bool   `json:"wait,omitempty"`
	// Peer, with Error, names the peer fetching the blob from its
	// registry, for the client to follow instead (claims).
	Peer string `json:"peer,omitempty"`
}

// Errors a server answers: a blob it does not hold, and one another peer
// is fetching (Peer says which).
const (
	errNotHeld   = "not found"
	errElsewhere = "fetched by another peer"
)

func writeLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// readLine reads one JSON line of at most maxLine bytes into v.
func readLine(r *bufio.Reader, v any) error {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine {
			return errors.New("header line too long")
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
	// Unknown fields are ignored, so a later version can add some.
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("bad header line: %w", err)
	}
	return nil
}
