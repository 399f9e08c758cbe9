package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs is where the marked tables and their runs are, from this package.
const docs = "../../docs"

// TestDocsTables checks every table the docs mark with
//
//	<!-- benchtable: [-runs] FILE... -->
//
// against what benchtable makes of those runs (FILEs from docs/): a
// figure edited by hand, a row lost in an edit or a run's file changed
// shows here, not in a reader's doubt.
func TestDocsTables(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(docs, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(text), "\n")
		for i, line := range lines {
			args, ok := strings.CutPrefix(line, "<!-- benchtable:")
			if !ok {
				continue
			}
			marked++
			args = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(args), "-->"))
			sh, files, err := parseArgs(strings.Fields(args))
			if err != nil {
				t.Errorf("%s:%d: %v", page, i+1, err)
				continue
			}
			for j := range files {
				files[j] = filepath.Join(docs, files[j])
			}
			var made strings.Builder
			if err := tables(&made, sh, files); err != nil {
				t.Errorf("%s:%d: %v", page, i+1, err)
				continue
			}
			want := strings.Split(strings.TrimSuffix(made.String(), "\n"), "\n")
			start := i + 1
			for start < len(lines) && lines[start] == "" {
				start++
			}
			// The page's lines from the table's first, and the next one
			// too if it is a row: one added by hand after the table.
			end := min(start+len(want), len(lines))
			got := lines[start:end]
			if end < len(lines) && strings.HasPrefix(lines[end], "|") {
				got = lines[start : end+1]
			}
			orderByHand := strings.HasSuffix(want[0], "| order |")
			for k := range max(len(got), len(want)) {
				if k < len(got) && k < len(want) && sameRow(got[k], want[k], orderByHand) {
					continue
				}
				var have, made string
				if k < len(got) {
					have = got[k]
				}
				if k < len(want) {
					made = want[k]
				}
				t.Errorf("%s:%d: the table is not what its runs make; make it again with (cd docs && go run ../hack/benchtable %s)\npage: %s\nruns: %s",
					page, start+k+1, args, have, made)
				break
			}
		}
	}
	if marked == 0 {
		t.Fatalf("no page in %s marks a table with <!-- benchtable: ... -->: nothing was checked", docs)
	}
}

// sameRow says whether a page's row is the one benchtable made. A run's
// order comes from its output where the output says it (kubelet's
// sub-benchmarks, a CRI burst's -place metrics); for output from before
// the places were reported benchtable writes "-", and the page may give
// the order by hand, from the run's log. With orderByHand (a per-run
// table, whose last column is the order) that one cell is not checked.
func sameRow(page, made string, orderByHand bool) bool {
	if page == made {
		return true
	}
	rest, ok := strings.CutSuffix(made, " | - |")
	if !orderByHand || !ok {
		return false
	}
	i := strings.LastIndex(strings.TrimSuffix(page, " |"), " | ")
	return i >= 0 && page[:i] == rest
}

func TestSameRow(t *testing.T) {
	made := "| Flood | WAN | 1 | 0.12 | - |"
	for _, tc := range []struct {
		name        string
		page, made  string
		orderByHand bool
		want        bool
	}{
		{name: "as made", page: made, made: made, want: true},
		{name: "order by hand", page: "| Flood | WAN | 1 | 0.12 | stock, again, pullwise |", made: made, orderByHand: true, want: true},
		{name: "order by hand, figure edited", page: "| Flood | WAN | 1 | 0.11 | stock, again, pullwise |", made: made, orderByHand: true, want: false},
		{name: "order by hand where the last column is not the order", page: "| Flood | WAN | 1 | 0.12 | stock |", made: made, want: false},
		{name: "order read from the run, page differs", page: "| Flood | WAN | 1 | 0.12 | stock, pullwise |", made: "| Flood | WAN | 1 | 0.12 | pullwise, stock |", orderByHand: true, want: false},
		{name: "a cell lost", page: "| Flood | WAN | 1 | stock |", made: made, orderByHand: true, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameRow(tc.page, tc.made, tc.orderByHand); got != tc.want {
				t.Errorf("sameRow(%q, %q, %v) = %v, want %v", tc.page, tc.made, tc.orderByHand, got, tc.want)
			}
		})
	}
}
