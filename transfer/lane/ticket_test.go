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
			tk.lent.Store(asked.Add(-time.Second).UnixNano())
			return tk
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
