package lane

import (
	"context"
	"iter"
	"sync/atomic"
	"time"
)

// Slack is how much sooner one pull must be due than another to overtake
// it or make it give way (Ahead); a line serves the earlier due first
// whatever the gap. Between pulls of about the same cost, passing or
// pausing work that holds a place would buy nothing and cost pauses.
// A second is well above the poll at which paused work looks again, and a
// fraction of what a large image costs to write.
const Slack = time.Second

// Ticket is a pull's place in line: when it is due. It starts at the time
// the pull was asked for; once the pull knows what it must write, Need
// moves it by that cost. Pulls of about the same cost keep the order they
// were asked in, and a small pull asked for a little after a large one
// goes first.
type Ticket struct {
	asked time.Time
	due   atomic.Int64 // UnixNano
	// costed is set once Need has placed the ticket: only then can the
	// pull be late.
	costed atomic.Bool
	// lent is the due of the earliest pull waiting on a lock this pull
	// holds (KeyedLock), UnixNano; 0: none.
	lent atomic.Int64
	// lentOn is that due per lock: the earliest due of the pulls waiting
	// on each lock this pull holds, by key (UnixNano); nil: none.
	lentOn atomic.Pointer[map[string]int64]
	// waits are the pull's work's waits for others' so far, by kind
	// (Waited).
	waits [waitKinds]atomic.Int64
}

// NewTicket returns the ticket of a pull asked for at asked.
func NewTicket(asked time.Time) *Ticket {
	t := &Ticket{asked: asked}
	t.due.Store(asked.UnixNano())
	return t
}

// Need places the pull by its cost (Costs.Of). Work already in line keeps
// its place; work that lines up after uses the new one.
func (t *Ticket) Need(cost time.Duration) {
	t.due.Store(t.asked.Add(cost).UnixNano())
	t.costed.Store(true)
}

// Cost is what Need placed the pull by, and whether it has been placed.
// The pull is late from when it was asked for plus its cost (Late).
func (t *Ticket) Cost() (time.Duration, bool) {
	if t == nil || !t.costed.Load() {
		return 0, false
	}
	return time.Duration(t.due.Load() - t.asked.UnixNano()), true
}

// Due is when the pull is due: when it was asked for plus its cost, or,
// while it holds a lock an earlier pull waits on, that pull's due.
func (t *Ticket) Due() time.Time {
	d := t.due.Load()
	if l := t.lent.Load(); l != 0 && l < d {
		d = l
	}
	return time.Unix(0, d)
}

// OwnDue is when the pull is due by its own ask and cost, without a due
// it lends (Due). Lateness goes by it, and so do extra places (Extra) and
// whom other work gives way to, but for work done under a lock others
// wait on (OwnDueUnder): a due lent to the whole pull serves only its own
// turns.
func (t *Ticket) OwnDue() time.Time { return time.Unix(0, t.due.Load()) }

// OwnDueOr is t's OwnDue, or at for work without a ticket.
func (t *Ticket) OwnDueOr(at time.Time) time.Time {
	if t == nil {
		return at
	}
	return t.OwnDue()
}

// OwnDueUnder is when work of the pull done under the lock key
// (KeyedLock; "" for none) is due to other pulls' work: its own due, or,
// while a pull due earlier waits on that lock, that pull's due. Work under
// a lock others wait on is the one piece of the pull that holds them up:
// a layer whose chain's snapshot another image shares (Guards). It takes
// extra places and counts among the work ahead by the waiter's own due,
// as the waiter's own work would, though it is not late by it (Late); the
// pull's other work does not (OwnDue), since every layer of a large image
// doing so would pass the small pull it lends for. An extra place taken
// by it is kept to the layer's end, though the waiter gives up.
func (t *Ticket) OwnDueUnder(key string, at time.Time) time.Time {
	if t == nil {
		return at
	}
	d := t.due.Load()
	if m := t.lentOn.Load(); m != nil && key != "" {
		if l, ok := (*m)[key]; ok && l < d {
			d = l
		}
	}
	return time.Unix(0, d)
}

// DueOr is t's Due, or at for work without a ticket, which lines up at the
// time it asks.
func (t *Ticket) DueOr(at time.Time) time.Time {
	if t == nil {
		return at
	}
	return t.Due()
}

// Late reports whether the pull is past its own due at now: it has waited
// as long as it takes, and nothing passes it over any more. A pull whose
// cost is not known is never late: its due is only when it was asked for.
//
// A due lent to the pull (KeyedLock) moves its work up in line but does
// not make it late, nor does one lent to the work under a lock
// (OwnDueUnder). Lateness is the whole pull's: lent, every layer of a
// large image holding the chain lock a small pull waits on would take an
// extra place once the small pull's due was past, not only the layer the
// small pull waits for.
func (t *Ticket) Late(now time.Time) bool {
	return t != nil && t.costed.Load() && now.After(t.OwnDue())
}

type ticketKey struct{}

// WithTicket marks ctx's work with its pull's ticket. Work without a
// ticket lines up at the time it asks.
func WithTicket(ctx context.Context, t *Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// TicketOf returns the ticket WithTicket gave ctx, or nil.
func TicketOf(ctx context.Context) *Ticket {
	t, _ := ctx.Value(ticketKey{}).(*Ticket)
	return t
}

// Ahead reports whether work due at mine is due more than slack before
// work due at other. Every overtaking and every pause asks it.
func Ahead(mine, other time.Time, slack time.Duration) bool {
	return mine.Add(slack).Before(other)
}

// AheadOfAll reports whether work due at mine is Ahead of each of others.
func AheadOfAll(mine time.Time, slack time.Duration, others iter.Seq[time.Time]) bool {
	for o := range others {
		if !Ahead(mine, o, slack) {
			return false
		}
	}
	return true
}

// Extra counts places taken beyond a limit, up to the limit more, and says
// who may take one: work that is late, or ahead of everything holding a
// place. The unpack lane (Lane) and the gate's hand back
// (transfer/gate.Handback) both follow it.
type Extra struct {
	limit int
	slack time.Duration // 0: no overtaking, and no extra places
	taken int
}

// NewExtra allows up to limit extra places, to work late or Ahead by
// slack (0: none).
func NewExtra(limit int, slack time.Duration) Extra {
	return Extra{limit: limit, slack: slack}
}

// May reports whether work with ticket t, due at mine, may take an extra
// place beside holders, the dues of the work holding places now. Both are
// own dues (Ticket.OwnDue, or OwnDueUnder for work under a lock waited on).
func (e *Extra) May(t *Ticket, mine time.Time, holders iter.Seq[time.Time]) bool {
	if e.slack == 0 || e.taken >= e.limit {
		return false
	}
	if t.Late(time.Now()) {
		return true
	}
	any := false
	for range holders {
		any = true
		break
	}
	return any && AheadOfAll(mine, e.slack, holders)
}

// Take and Give count an extra place taken and given back.
func (e *Extra) Take() { e.taken++ }

// Give counts an extra place given back.
func (e *Extra) Give() { e.taken-- }

// Taken is how many extra places are taken, for tests.
func (e *Extra) Taken() int { return e.taken }
