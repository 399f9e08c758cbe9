// Package aliases stores, in the transaction that stores a pull's image
// record, the records its caller makes for the same image once the pull
// returns. CRI names every image it pulls by its ID and its repo digest
// too, and Pullwise then labels those records with the pull's source.
//
// Why: every metadata write is a synced database transaction, and the node
// has one writer at a time (docs/pull-gate.md, "Metadata writes in due
// order"). Made after the pull, CRI's two records and their two labels
// cost four more synced writes at the end of every CRI pull, each waiting
// behind every other pull's writes before the pull can return. Made here,
// labelled, they share the pull's own write, and CRI and the labeller
// find them as they would have left them and write nothing.
package aliases

import (
	"context"
	"errors"
	"maps"
	"slices"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/metadata/boltutil"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
)

// Names returns the other names the caller will give img once the pull
// that stores it returns; none for a record it will not name again.
type Names func(ctx context.Context, img images.Image) ([]string, error)

type namesKey struct{}

// With has the image records stored under ctx through a Store made with
// the names names returns for them.
func With(ctx context.Context, names Names) context.Context {
	return context.WithValue(ctx, namesKey{}, names)
}

// Store is the metadata image store a pull's records are written through.
// A record written whole (a create, or an update without field paths)
// under a context that has Names is written in one transaction with a
// record of each of its names that does not exist yet: the same target
// and labels. A name that exists is left to its owner, who updates it as
// it would have.
type Store struct {
	images.Store // over DB
	DB           *metadata.DB
}

// errAlias ends a transaction whose alias could not be written, so that
// the record is written alone.
var errAlias = errors.New("alias not written")

// The topics the metadata store publishes a record's write on, outside a
// transaction.
const (
	topicCreate = "/images/create"
	topicUpdate = "/images/update"
)

func (s Store) Create(ctx context.Context, img images.Image) (images.Image, error) {
	return s.write(ctx, img, topicCreate, func(ctx context.Context) (images.Image, error) {
		return s.Store.Create(ctx, img)
	})
}

func (s Store) Update(ctx context.Context, img images.Image, fieldpaths ...string) (images.Image, error) {
	update := func(ctx context.Context) (images.Image, error) { return s.Store.Update(ctx, img, fieldpaths...) }
	if len(fieldpaths) > 0 {
		return update(ctx)
	}
	return s.write(ctx, img, topicUpdate, update)
}

// write runs write, and creates img's aliases in its transaction. topic is
// where write publishes: the store publishes nothing inside a transaction,
// so the events of the records written go out after it.
//
// A record written within the caller's own transaction is written alone:
// opening another would wait for the caller's to end, forever, and one
// joined could not be rolled back alone when an alias fails, nor its
// events sent once it commits.
func (s Store) write(ctx context.Context, img images.Image, topic string, write func(context.Context) (images.Image, error)) (images.Image, error) {
	if _, inTx := boltutil.Transaction(ctx); inTx {
		return write(ctx)
	}
	names := s.aliases(ctx, img)
	if len(names) == 0 || s.DB == nil {
		return write(ctx)
	}
	var stored images.Image
	var created []images.Image
	err := s.DB.Update(func(tx *bolt.Tx) error {
		tctx := boltutil.WithTransaction(ctx, tx)
		var err error
		if stored, err = write(tctx); err != nil {
			return err
		}
		for _, n := range names {
			rec, err := s.Store.Create(tctx, images.Image{Name: n, Target: stored.Target, Labels: maps.Clone(stored.Labels)})
			if errdefs.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				log.G(ctx).WithError(err).WithField("image", n).Warn("alias not stored with its image; its owner will store it")
				return errAlias
			}
			created = append(created, rec)
		}
		return nil
	})
	if errors.Is(err, errAlias) {
		return write(ctx)
	}
	if err != nil {
		return images.Image{}, err
	}
	s.publish(ctx, topic, stored)
	for _, rec := range created {
		s.publish(ctx, topicCreate, rec)
	}
	return stored, nil
}

// aliases returns img's names other than its own, once each.
func (s Store) aliases(ctx context.Context, img images.Image) []string {
	fn, _ := ctx.Value(namesKey{}).(Names)
	if fn == nil {
		return nil
	}
	names, err := fn(ctx, img)
	if err != nil {
		log.G(ctx).WithError(err).WithField("image", img.Name).Debug("no aliases: their owner will store them")
		return nil
	}
	var out []string
	for _, n := range names {
		if n != "" && n != img.Name && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// publish sends the event the metadata store would have sent for img.
func (s Store) publish(ctx context.Context, topic string, img images.Image) {
	p := s.DB.Publisher(ctx)
	if p == nil {
		return
	}
	var ev any = &eventstypes.ImageCreate{Name: img.Name, Labels: img.Labels}
	if topic == topicUpdate {
		ev = &eventstypes.ImageUpdate{Name: img.Name, Labels: img.Labels}
	}
	if err := p.Publish(ctx, topic, ev); err != nil {
		log.G(ctx).WithError(err).WithField("image", img.Name).Warn("image event not published")
	}
}
