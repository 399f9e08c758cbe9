package early

import (
	"context"

	"github.com/containerd/containerd/v2/core/content"
)

// tee is the content store as a background download writes to it: every
// byte written is spooled for the layer's apply too.
type tee struct {
	content.Ingester
	a *arrival
}

func (t tee) Writer(ctx context.Context, opts ...content.WriterOpt) (content.Writer, error) {
	w, err := t.Ingester.Writer(ctx, opts...)
	if err != nil {
		return nil, err
	}
	st, err := w.Status()
	if err != nil || st.Offset != 0 {
		// An earlier pull left part of the blob in the ingest; the
		// download resumes after it, where the spool cannot start.
		t.a.spoil()
	}
	return teeWriter{Writer: w, a: t.a}, nil
}

type teeWriter struct {
	content.Writer
	a *arrival
}

func (w teeWriter) Write(p []byte) (int, error) {
	n, err := w.Writer.Write(p)
	w.a.add(p[:n])
	return n, err
}

// Truncate restarts the blob (content.Copy after a reset); the spool does
// not follow.
func (w teeWriter) Truncate(size int64) error {
	w.a.spoil()
	return w.Writer.Truncate(size)
}
