package lane

import (
	"testing"
	"time"
)

// TestTicketCost: a ticket tells what it was priced at, which stays its
// cost while it lends an earlier due, and nothing before it is priced.
func TestTicketCost(t *testing.T) {
	asked := time.Now()
	cases := []struct {
		name   string
		ticket func() *Ticket
		want   time.Duration
		priced bool
	}{
		{name: "no ticket", ticket: func() *Ticket { return nil }},
		{name: "not priced yet", ticket: func() *Ticket { return NewTicket(asked) }},
		{name: "priced", priced: true, want: 3 * time.Second, ticket: func() *Ticket {
			tk := NewTicket(asked)
			tk.Need(3 * time.Second)
			return tk
		}},
		{name: "priced at nothing", priced: true, ticket: func() *Ticket {
			tk := NewTicket(asked)
			tk.Need(0)
			return tk
		}},
		{name: "lending an earlier due", priced: true, want: 3 * time.Second, ticket: func() *Ticket {
			tk := NewTicket(asked)
			tk.Need(3 * time.Second)
			return lends(tk, asked.Add(-time.Second))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, priced := tc.ticket().Cost()
			if got != tc.want || priced != tc.priced {
				t.Fatalf("Cost() = %v, %v; want %v, %v", got, priced, tc.want, tc.priced)
			}
		})
	}
}

// TestTicketLate: a priced pull is late past its own due; a due it lends
// (KeyedLock) does not make it late, and a pull not priced never is.
func TestTicketLate(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name   string
		none   bool          // no ticket at all
		asked  time.Duration // before now
		cost   time.Duration // -1: not priced
		lentAt time.Duration // before now; 0: nothing lent
		late   bool
	}{
		{name: "no ticket", none: true},
		{name: "not priced", asked: time.Hour, cost: -1},
		{name: "before its due", asked: time.Second, cost: time.Minute},
		{name: "past its due", asked: time.Minute, cost: time.Second, late: true},
		{name: "lending a due already past", asked: time.Second, cost: time.Minute, lentAt: 30 * time.Second},
		{name: "lending, and past its own due", asked: time.Minute, cost: time.Second, lentAt: 2 * time.Minute, late: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tk *Ticket
			if !tc.none {
				tk = NewTicket(now.Add(-tc.asked))
				if tc.cost >= 0 {
					tk.Need(tc.cost)
				}
				if tc.lentAt != 0 {
					lends(tk, now.Add(-tc.lentAt))
				}
			}
			if got := tk.Late(now); got != tc.late {
				t.Fatalf("Late() = %v, want %v", got, tc.late)
			}
		})
	}
}

// lends makes tk lend due, as KeyedLock does while a pull due then waits
// on a lock tk's pull holds.
func lends(tk *Ticket, due time.Time) *Ticket {
	tk.lent.Store(due.UnixNano())
	return tk
}
