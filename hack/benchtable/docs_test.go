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
			perRun, files, err := parseArgs(strings.Fields(args))
			if err != nil {
				t.Errorf("%s:%d: %v", page, i+1, err)
				continue
			}
			for j := range files {
				files[j] = filepath.Join(docs, files[j])
			}
			var made strings.Builder
			if err := tables(&made, perRun, files); err != nil {
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
			for k := range max(len(got), len(want)) {
				if k < len(got) && k < len(want) && got[k] == want[k] {
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
