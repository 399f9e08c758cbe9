// Package hub fans image pull progress out to subscribers (KEP-5334). It
// is fed synchronously from inside pulls, so publishing never waits on a
// subscriber: each subscriber keeps only the latest state of each layer,
// and a slow one skips what it had no time to read.
package hub

import (
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
)

// Event is one line of a progress stream, in KEP-5334's shape. A layer
// line has Layer set to the layer digest; an image summary line has it
// empty. Progress and Total are always sent.
type Event struct {
	Image    string `json:"image,omitempty"`
	Layer    string `json:"layer,omitempty"`
	Progress int64  `json:"progress"`
	Total    int64  `json:"total"`
	Error    string `json:"error,omitempty"`
	// State is StateLazy for a layer a remote snapshotter mounted:
	// done, with none of its bytes fetched by the pull. Empty otherwise,
	// so every other line has exactly KEP-5334's keys.
	State string `json:"state,omitempty"`
}

// StateLazy marks a layer mounted lazily by a remote snapshotter (stargz,
// SOCI, nydus); its bytes are read from the registry on demand, later.
const StateLazy = "lazy"

// EventLazy is the transfer progress event Pullwise sends for a layer
// mounted lazily; containerd itself sends none for it.
const EventLazy = "lazy"

// Pull identifies a pull to selectors: the image and the pods waiting on it.
type Pull struct {
	Image string   // normalized reference
	Pods  []string // pod UIDs
}

// Selector chooses the pulls a subscriber sees.
type Selector func(Pull) bool

// Hub tracks pulls in flight and their subscribers. The zero value is
// ready.
type Hub struct {
	mu    sync.Mutex
	pulls map[string]*pull // by pull key
	subs  map[*Subscription]struct{}
}

type pull struct {
	key    string
	image  string
	pods   map[string]int // pod UID -> callers
	layers map[string]*Event
	order  []string // layer digests in first-seen order
	// fetched counts bytes read from the registry per blob; a layer's
	// progress follows it (containerd reports none while it unpacks).
	fetched  map[string]int64
	notified map[string]time.Time // last wake-up per layer, for byte counts
	done     bool
}

func (p *pull) info() Pull {
	out := Pull{Image: p.image}
	for uid := range p.pods {
		out.Pods = append(out.Pods, uid)
	}
	return out
}

// Join records a caller of pull key for image, on behalf of pod (may be
// ""). Pulls shared by several callers are one pull with several pods.
func (h *Hub) Join(key, image, pod string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pulls == nil {
		h.pulls = map[string]*pull{}
	}
	p := h.pulls[key]
	if p == nil || p.done {
		p = &pull{key: key, image: image, pods: map[string]int{}, layers: map[string]*Event{}}
		h.pulls[key] = p
	}
	if pod != "" {
		p.pods[pod]++
	}
	h.notifyLocked(p, nil)
}

// Leave undoes a Join; the pull is forgotten once it is done and has no
// callers left.
func (h *Hub) Leave(key, pod string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pulls[key]
	if p == nil {
		return
	}
	if pod != "" {
		if p.pods[pod]--; p.pods[pod] <= 0 {
			delete(p.pods, pod)
		}
	}
	if p.done {
		delete(h.pulls, key)
		h.notifyLocked(p, nil)
	}
}

// Update records a transfer progress event of pull key. Only layer events
// matter to subscribers; the rest are ignored. It never blocks.
func (h *Hub) Update(key string, ev transfer.Progress) {
	layer, ok := strings.CutPrefix(ev.Name, "layer-")
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pulls[key]
	if p == nil || p.done {
		return
	}
	e := p.layers[layer]
	if e == nil {
		e = &Event{Image: p.image, Layer: layer}
		p.layers[layer] = e
		p.order = append(p.order, layer)
	}
	if ev.Event == "waiting" && p.fetched[layer] > 0 {
		// The fetch raced ahead of its announcement.
		ev.Progress = p.fetched[layer]
	}
	switch ev.Event {
	case EventLazy:
		e.Total = max(e.Total, ev.Total)
		e.Progress = e.Total
		e.State = StateLazy
	case "complete", "already exists", "extracted":
		// Nothing is left to download; an existing layer may come with no
		// sizes at all.
		if ev.Total > 0 {
			e.Total = ev.Total
		}
		e.Progress = e.Total
	default:
		e.Total = max(e.Total, ev.Total)
		e.Progress = min(max(e.Progress, ev.Progress), e.Total)
	}
	h.notifyLocked(p, []Event{*e})
}

// Downloaded adds n bytes fetched of blob dgst to pull key. containerd's
// own progress events often jump from waiting straight to extracted (the
// unpacker fetches layers itself), so the bytes read from the registry are
// what shows a layer moving. Blobs that are not layers are ignored. It
// returns the layer's state, for other observers of the pull.
func (h *Hub) Downloaded(key, dgst string, n int64) (Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pulls[key]
	if p == nil || p.done {
		return Event{}, false
	}
	if p.fetched == nil {
		p.fetched = map[string]int64{}
	}
	p.fetched[dgst] += n
	e := p.layers[dgst]
	if e == nil {
		return Event{}, false
	}
	was := e.Progress
	if e.Total > 0 {
		e.Progress = max(e.Progress, min(p.fetched[dgst], e.Total))
	} else {
		e.Progress = max(e.Progress, p.fetched[dgst])
	}
	// Bytes arrive in small chunks; subscribers coalesce to a few lines a
	// second anyway, so waking them for every chunk only costs the pull CPU.
	// The first bytes and the last always go out.
	now := time.Now()
	if was == 0 || e.Progress == e.Total || now.Sub(p.notified[dgst]) >= notifyEvery {
		if p.notified == nil {
			p.notified = map[string]time.Time{}
		}
		p.notified[dgst] = now
		h.notifyLocked(p, []Event{*e})
	}
	return *e, true
}

// notifyEvery is how often byte counts of one layer wake subscribers.
const notifyEvery = 20 * time.Millisecond

// Finish ends pull key: on success every layer is complete; on failure
// the image line carries the error. Subscribers get the final lines.
func (h *Hub) Finish(key string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pulls[key]
	if p == nil || p.done {
		return
	}
	var final []Event
	sum := Event{Image: p.image}
	for _, l := range p.order {
		e := p.layers[l]
		if err == nil {
			e.Progress = e.Total
		}
		final = append(final, *e)
		sum.Progress += e.Progress
		sum.Total += e.Total
	}
	if err != nil {
		sum.Error = err.Error()
	}
	final = append(final, sum)
	p.done = true
	h.notifyLocked(p, final)
	if len(p.pods) == 0 {
		delete(h.pulls, key)
	}
}

// snapshotLocked is the current state of p as lines: its layers, then the
// image line.
func (p *pull) snapshotLocked() []Event {
	out := make([]Event, 0, len(p.order)+1)
	sum := Event{Image: p.image}
	for _, l := range p.order {
		e := p.layers[l]
		out = append(out, *e)
		sum.Progress += e.Progress
		sum.Total += e.Total
	}
	return append(out, sum)
}

func (h *Hub) notifyLocked(p *pull, events []Event) {
	info := p.info()
	for s := range h.subs {
		if s.sel(info) {
			s.offer(p.key, events, p.done)
		}
	}
}
