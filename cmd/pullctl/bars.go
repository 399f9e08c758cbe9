package main

import (
	"io"
	"math"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// barView draws a progress stream on a terminal with mpb, which redraws
// the whole block in place at a steady rate and clips it to the
// terminal's width and height, so nothing flickers or scrolls. It shows:
//   - a line per image, the sum of its layers (bytes, rate, ETA), kept when
//     the image is done;
//   - a line per layer in flight under its image, removed when done, so a
//     large image fits the screen;
//   - with more than one image (a pod's pulls), a total line last.
//
// The stream's numbers are absolute, so bars are set, not incremented.
type barView struct {
	p      *mpb.Progress
	images map[string]*imageBars
	total  *mpb.Bar
}

type imageBars struct {
	rank   int // order of appearance, for the bar priorities
	bar    *mpb.Bar
	layers map[string]*layerBar
	done   bool
}

type layerBar struct {
	bar             *mpb.Bar
	progress, total int64
}

// Priorities order the lines top to bottom: an image, then its layers, and
// the total last.
const (
	imageSpan     = 1 << 16
	totalPriority = math.MaxInt32
)

func newBarView(out io.Writer, opts ...mpb.ContainerOption) *barView {
	return &barView{
		p:      mpb.New(append([]mpb.ContainerOption{mpb.WithOutput(out)}, opts...)...),
		images: map[string]*imageBars{},
	}
}

func (v *barView) newBar(label string, priority int, opts ...mpb.BarOption) *mpb.Bar {
	return v.p.New(0, mpb.BarStyle(),
		append([]mpb.BarOption{
			mpb.BarPriority(priority),
			mpb.PrependDecorators(decor.Name(label, decor.WCSyncSpaceR)),
			mpb.AppendDecorators(
				decor.CountersKibiByte("% .1f / % .1f", decor.WCSyncSpace),
				decor.AverageSpeed(decor.SizeB1024(0), "% .1f", decor.WCSyncSpace),
				// A pull that failed or was cancelled says so where its
				// ETA was; the error itself is printed when the stream ends.
				decor.OnAbort(decor.OnComplete(decor.AverageETA(decor.ET_STYLE_GO, decor.WCSyncSpace), "done"), "stopped"),
			),
		}, opts...)...)
}

func (v *barView) update(l line) {
	img := v.images[l.Image]
	if img == nil {
		img = &imageBars{rank: len(v.images), layers: map[string]*layerBar{}}
		img.bar = v.newBar(clip(l.Image, 40), img.rank*imageSpan)
		v.images[l.Image] = img
		if len(v.images) == 2 {
			v.total = v.newBar("total", totalPriority)
		}
	}
	if img.done {
		return
	}
	switch {
	case l.Error != "":
		for _, lb := range img.layers {
			lb.bar.Abort(true)
		}
		img.bar.Abort(false)
		img.done = true
	case l.Layer != "":
		lb := img.layers[l.Layer]
		if lb == nil {
			name := shortDigest(l.Layer)
			if l.State != "" {
				name += " " + l.State
			}
			lb = &layerBar{bar: v.newBar(name, img.rank*imageSpan+1+len(img.layers), mpb.BarRemoveOnComplete())}
			img.layers[l.Layer] = lb
		}
		lb.progress, lb.total = l.Progress, l.Total
		set(lb.bar, l.Progress, l.Total, true)
		var done, total int64
		for _, lb := range img.layers {
			done, total = done+lb.progress, total+lb.total
		}
		// Layers done so far do not make the image done: more may come.
		set(img.bar, done, total, false)
	default:
		// The image's own line: its final size, which also counts layers
		// the node had already and the stream never mentioned.
		img.done = l.Total > 0 && l.Progress >= l.Total
		set(img.bar, l.Progress, l.Total, img.done)
	}
	v.updateTotal()
}

func (v *barView) updateTotal() {
	if v.total == nil {
		return
	}
	var done, total int64
	all := true
	for _, img := range v.images {
		done, total = done+img.bar.Current(), total+imageTotal(img)
		all = all && img.done
	}
	v.total.SetTotal(total, false)
	v.total.SetCurrent(done)
	if all {
		v.total.SetTotal(total, true)
	}
}

func imageTotal(img *imageBars) int64 {
	var t int64
	for _, lb := range img.layers {
		t += lb.total
	}
	return max(t, img.bar.Current())
}

// set moves a bar to an absolute position, completing it at the end when
// complete is set. (A bar made with total 0 never completes by itself.)
func set(b *mpb.Bar, progress, total int64, complete bool) {
	if total > 0 {
		b.SetTotal(total, false)
	}
	b.SetCurrent(progress)
	if complete && total > 0 && progress >= total {
		b.SetTotal(total, true)
	}
}

// finish ends every bar and waits for the last frame. A stream that ended
// before a pull finished (Ctrl-C, a pull cancelled elsewhere) leaves its
// bars aborted, still showing how far they got.
func (v *barView) finish() {
	for _, img := range v.images {
		for _, lb := range img.layers {
			if !lb.bar.Completed() {
				lb.bar.Abort(true)
			}
		}
		if !img.bar.Completed() {
			img.bar.Abort(false)
		}
	}
	if v.total != nil && !v.total.Completed() {
		v.total.Abort(false)
	}
	v.p.Wait()
}

// clip keeps the end of a long name, which tells images apart better than
// the registry host at its start.
func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return "…" + string(r[len(r)-n+1:])
	}
	return s
}
