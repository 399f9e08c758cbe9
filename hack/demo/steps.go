package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/docker/go-units"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// demoImage is a generated image seeded on upstream: layers of random
// bytes, so they are as large on the wire as on disk.
type demoImage struct {
	repo, tag string
	layers    []int64
	seed      int64
}

func (i demoImage) size() int64 {
	var n int64
	for _, l := range i.layers {
		n += l
	}
	return n
}

const mib = 1 << 20

var (
	web    = demoImage{"demo/web", "1.0", []int64{5 * mib, 3 * mib, 2 * mib}, 1}
	burst  = []demoImage{{"demo/api", "1.0", []int64{3 * mib, mib}, 2}, {"demo/worker", "1.0", []int64{3 * mib, mib}, 3}, {"demo/cache", "1.0", []int64{3 * mib, mib}, 4}, {"demo/db", "1.0", []int64{3 * mib, mib}, 5}}
	batch  = demoImage{"demo/batch", "1.0", []int64{4 * mib, 4 * mib}, 6}
	report = demoImage{"demo/report", "1.0", []int64{2 * mib}, 7}
)

func (d *demo) run(ctx context.Context) error {
	all := []func(context.Context) error{d.setup, d.firstPull, d.images, d.fastPath, d.limit, d.mirrorDown}
	for i, step := range all {
		if err := step(ctx); err != nil {
			return err
		}
		if i == len(all)-1 {
			return nil
		}
		if err := d.pause(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) setup(ctx context.Context) error {
	s := d.s
	d.heading("Starting a registry, a mirror and Pullwise's containerd under " + s.dir)
	if err := s.prepare(); err != nil {
		return err
	}
	if err := s.startRegistries(); err != nil {
		return err
	}
	link := fmt.Sprintf("%s, %s/s", s.wan.Latency, units.BytesSize(float64(s.wan.BytesPerSecond)))
	d.note("upstream  %s  a registry behind a simulated WAN link (%s)", s.upstream.Host(), link)
	d.note("mirror    %s  a pull-through cache of upstream, same link, first in hosts.toml", s.mirror.Host())
	var names []string
	for _, img := range append(append([]demoImage{web}, burst...), batch, report) {
		if _, err := s.upstreamReg.PushContext(ctx, img.repo, img.tag, registry.Image{Layers: img.layers, Seed: img.seed}); err != nil {
			return err
		}
		names = append(names, fmt.Sprintf("%s:%s (%s)", img.repo, img.tag, units.BytesSize(float64(img.size()))))
	}
	d.note("images    on upstream: %s", strings.Join(names[:4], ", "))
	d.note("          %s", strings.Join(names[4:], ", "))
	if err := s.writeConfig(d.contrib); err != nil {
		return err
	}
	if err := s.startContainerd(ctx); err != nil {
		return err
	}
	d.note("daemon    bin/containerd with %s, max_parallel_image_pulls = %d", d.contrib, s.maxPulls)
	d.note("          and paths under %s (config.toml, containerd.log)", s.dir)
	d.note("pullctl   bin/pullctl -r unix://%s", s.path("containerd.sock"))
	return nil
}

func (d *demo) firstPull(ctx context.Context) error {
	d.stepHeading("A first pull, with live progress")
	took, err := d.timed(ctx, "pull", d.s.ref(web))
	if err != nil {
		return err
	}
	d.note("%s in %s. The image is named after upstream, but Source names the", units.BytesSize(float64(web.size())), seconds(took))
	d.note("mirror %s: hosts.toml put it first and it served the pull.", d.s.mirror.Host())
	return nil
}

func (d *demo) images(ctx context.Context) error {
	d.stepHeading("Where each image came from")
	if err := d.show(ctx, "images"); err != nil {
		return err
	}
	d.note("PULL SOURCE is the io.pullwise.pull-source label (KEP-4589): kept with the image,")
	d.note("also in `pullctl inspecti` and CRI's verbose ImageStatus.")
	return nil
}

func (d *demo) fastPath(ctx context.Context) error {
	d.stepHeading("The same image again: the fast path")
	d.s.mirrorReg.Reset()
	took, err := d.timed(ctx, "pull", d.s.ref(web))
	if err != nil {
		return err
	}
	asked, err := d.mirrorRequests(ctx)
	if err != nil {
		return err
	}
	d.note("Present and unpacked, so Always only checks the tag: %s, no pull slot,", seconds(took))
	d.note("the mirror answered %s.", asked)
	if _, err := d.timed(ctx, "pull", "--policy", "IfNotPresent", d.s.ref(web)); err != nil {
		return err
	}
	asked, err = d.mirrorRequests(ctx)
	if err != nil {
		return err
	}
	d.note("IfNotPresent asks no registry at all: the mirror answered %s.", asked)
	return nil
}

// mirrorRequests describes the requests the mirror answered since the
// last call (or Reset), then forgets them.
func (d *demo) mirrorRequests(ctx context.Context) (string, error) {
	r := d.s.mirrorReg
	if err := r.WaitIdle(ctx); err != nil {
		return "", err
	}
	reqs := r.Requests()
	r.Reset()
	if len(reqs) == 0 {
		return "no request", nil
	}
	var kinds []string
	var blobBytes int64
	for _, q := range reqs {
		kinds = append(kinds, q.Method+" "+string(q.Kind))
		if q.Kind == registry.KindBlob {
			blobBytes += q.Bytes
		}
	}
	plural := "s"
	if len(reqs) == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d request%s (%s) and sent %s of layers", len(reqs), plural, strings.Join(kinds, ", "), units.BytesSize(float64(blobBytes))), nil
}

func (d *demo) limit(ctx context.Context) error {
	d.stepHeading(fmt.Sprintf("Four pulls at once, %d at a time", d.s.maxPulls))
	var pulls []*bgPull
	for _, img := range burst {
		pulls = append(pulls, d.pullInBackground(ctx, d.s.ref(img)))
	}
	// Shown once bytes flow, so the listing has progress to show.
	err := d.awaitPulls(ctx, "queued pulls", func(ps []*api.Pull) bool {
		return len(ps) == len(burst) && count(ps, "waiting") > 0 && count(ps, "pulling") == flowing(ps)
	})
	if err != nil {
		return err
	}
	if err := d.show(ctx, "pulls"); err != nil {
		return err
	}
	d.note("max_parallel_image_pulls = %d: two pulls transfer, the others wait for a slot,", d.s.maxPulls)
	d.note("first come first served (pull_queue_timeout would bound the wait). A moment later:")
	err = d.awaitPulls(ctx, "the queue to drain", func(ps []*api.Pull) bool {
		return len(ps) > 0 && len(ps) < len(burst) && count(ps, "waiting") == 0 && count(ps, "pulling") == flowing(ps)
	})
	if err != nil {
		return err
	}
	if err := d.show(ctx, "pulls"); err != nil {
		return err
	}
	d.note("The first two have their layers and gave their slots to the waiting ones. What each pullctl printed:")
	for _, p := range pulls {
		if err := d.wait(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// flowing counts the pulls that have received layer bytes.
func flowing(ps []*api.Pull) int {
	n := 0
	for _, p := range ps {
		if p.GetBytesDone() > mib/4 {
			n++
		}
	}
	return n
}

func count(ps []*api.Pull, state string) int {
	n := 0
	for _, p := range ps {
		if p.GetState() == state {
			n++
		}
	}
	return n
}

func (d *demo) mirrorDown(ctx context.Context) error {
	s := d.s
	d.stepHeading("The mirror goes down in the middle of a pull")
	s.upstreamReg.Reset()
	p := d.pullInBackground(ctx, s.ref(batch))
	err := d.awaitPulls(ctx, "a quarter of "+batch.repo, func(ps []*api.Pull) bool {
		for _, p := range ps {
			if strings.Contains(p.GetImage(), batch.repo) && p.GetBytesTotal() > 0 && p.GetBytesDone() >= p.GetBytesTotal()/4 {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	if err := d.show(ctx, "pulls"); err != nil {
		return err
	}
	if err := s.mirror.Cut(); err != nil {
		return err
	}
	d.note("The mirror %s is down now: its listener is closed, its connections cut mid-layer.", s.mirror.Host())
	if err := d.wait(ctx, p); err != nil {
		return err
	}
	if err := s.upstreamReg.WaitIdle(ctx); err != nil {
		return err
	}
	d.note("The pull went on from upstream; Source still names the mirror, which resolved the tag.")
	for _, q := range s.upstreamReg.Requests() {
		// The mirror's own fetches from upstream are not containerd's.
		if r := q.Header.Get("Range"); q.Kind == registry.KindBlob && r != "" && strings.HasPrefix(q.Header.Get("User-Agent"), "containerd") {
			d.note("Upstream got %s %s with Range: %s: that layer resumed where the mirror stopped.", q.Method, short(q.Reference), r)
		}
	}
	if err := d.show(ctx, "registries"); err != nil {
		return err
	}
	d.note("Pullwise remembers that the mirror (%s) failed: every pull on the node skips it", s.mirror.Host())
	d.note("until the cooldown (registry_cooldown) ends, then one request probes it. The next pull:")
	skippedBefore, err := d.skipped(ctx)
	if err != nil {
		return err
	}
	if err := d.show(ctx, "pull", s.ref(report)); err != nil {
		return err
	}
	skipped, err := d.skipped(ctx)
	if err != nil {
		return err
	}
	d.note("It came from upstream %s: the node sent none of its %d requests to the mirror.", s.upstream.Host(), skipped-skippedBefore)
	if err := d.show(ctx, "images"); err != nil {
		return err
	}
	d.note("All but %s came through the mirror %s.", report.repo, s.mirror.Host())
	return nil
}

// short is a digest cut to what a person reads: sha256:0123456789ab.
func short(dgst string) string {
	if i := strings.IndexByte(dgst, ':'); i >= 0 && len(dgst) > i+13 {
		return dgst[:i+13]
	}
	return dgst
}

// skipped is how many requests the node did not send to the mirror because
// it was marked down.
func (d *demo) skipped(ctx context.Context) (uint64, error) {
	resp, err := d.s.api.ListRegistries(ctx, &api.ListRegistriesRequest{})
	if err != nil {
		return 0, fmt.Errorf("list registries: %w", err)
	}
	for _, h := range resp.GetHosts() {
		if strings.Contains(h.GetHost(), "//"+d.s.mirror.Host()+"/") {
			return h.GetRequests()["skipped"], nil
		}
	}
	return 0, nil
}
