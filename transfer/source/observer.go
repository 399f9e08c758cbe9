package source

import (
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/hostclient"
)

// observer is how a recorder hears from its pull's host clients. It keeps
// the recorder's own API to what a pull asks of it.
type observer struct{ r *Recorder }

func (r *Recorder) observer() hostclient.Observer { return observer{r} }

func (o observer) IsConfig(d digest.Digest) bool { return o.r.fetchWatch().isConfig(d) }

func (o observer) Attempted(a hostclient.Attempt) { o.r.attempt(a) }

func (o observer) AskedToWait(d time.Duration) { o.r.noteRetryAfter(d) }

// Manifest notes the host that answered, and, for a watched pull, asks
// for the body: an image manifest's layers are what the pull has left to
// fetch.
func (o observer) Manifest(host, repo, ref string, get bool) func([]byte) {
	o.r.manifest(host, repo, ref)
	if get && o.r.fetchWatch() != nil {
		return o.r.manifestBody
	}
	return nil
}

func (o observer) Blob(host, dgst string) func(int64) { return o.r.blob(host, dgst) }
