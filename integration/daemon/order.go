package daemon

// Order is the order in which the daemons named go in the i-th burst of
// a side-by-side benchmark, so that none always meets a cold registry or
// a disk still writing back the last one's work: two alternate; three go
// through the six orders, so that over six bursts each goes before each
// other as often as after (a rotation alone would put one pair 2:1).
// Other counts keep the order given.
func Order(i int, names ...string) []string {
	switch len(names) {
	case 2:
		if i%2 == 1 {
			return []string{names[1], names[0]}
		}
	case 3:
		// The first three are the rotations, so that in three bursts
		// each goes first once.
		o := orders3[i%len(orders3)]
		return []string{names[o[0]], names[o[1]], names[o[2]]}
	}
	return names
}

var orders3 = [][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}, {1, 0, 2}, {0, 2, 1}}
