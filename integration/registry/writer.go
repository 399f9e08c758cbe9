package registry

import (
	"context"
	"errors"
	"net/http"
	"time"
)

var errTruncated = errors.New("registry: response truncated by injected fault")

// maxPaceChunk bounds a single throttled write so pacing stays smooth for
// high rates.
const maxPaceChunk = 32 << 10

// responseWriter records status and body size and applies throttling and
// truncation. It deliberately does not implement io.ReaderFrom, so copies
// from the registry go through Write where limits are enforced.
type responseWriter struct {
	http.ResponseWriter
	ctx        context.Context
	status     int
	bytes      int64
	bps        int64 // <= 0: unthrottled
	truncateAt int64 // < 0: never
	truncated  bool
	paceStart  time.Time
}

func (w *responseWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	cut := false
	if w.truncateAt >= 0 {
		room := w.truncateAt - w.bytes
		if int64(len(p)) > room {
			p, cut = p[:max(room, 0)], true
		}
	}
	n, err := w.writePaced(p)
	if err == nil && cut {
		w.truncated = true
		err = errTruncated
	}
	return n, err
}

// writePaced sends p so that byte b leaves no earlier than b/bps after the
// first body write; a client can therefore never receive a body faster.
func (w *responseWriter) writePaced(p []byte) (int, error) {
	if w.bps <= 0 {
		n, err := w.ResponseWriter.Write(p)
		w.bytes += int64(n)
		return n, err
	}
	if w.paceStart.IsZero() {
		w.paceStart = time.Now()
	}
	chunk := int(min(max(w.bps/10, 1), maxPaceChunk))
	written := 0
	for written < len(p) {
		c := p[written:min(written+chunk, len(p))]
		due := w.paceStart.Add(time.Duration(float64(w.bytes+int64(len(c))) / float64(w.bps) * float64(time.Second)))
		if err := sleep(w.ctx, time.Until(due)); err != nil {
			return written, err
		}
		n, err := w.ResponseWriter.Write(c)
		w.bytes += int64(n)
		written += n
		if err != nil {
			return written, err
		}
		w.flush()
	}
	return written, nil
}

func (w *responseWriter) flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Flush lets streaming handlers push data through the recorder.
func (w *responseWriter) Flush() { w.flush() }

// Unwrap exposes the underlying writer to http.ResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
