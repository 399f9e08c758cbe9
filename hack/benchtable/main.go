// Command benchtable turns the corpus benchmarks' output (go test -bench
// 'Corpus' in ./integration/ and ./integration/kubelet/) into the tables
// of docs/benchmarks.md and docs/benchmarks-history.md, each cell bold
// where it misses issue 39's goal (goals.go):
//
//	go run ./hack/benchtable FILE...        per scenario, first · median · last over every run
//	go run ./hack/benchtable -runs FILE...  a row per run, with noise, CPU, peak RSS and order
//	go run ./hack/benchtable -floors FILE... per CRI scenario, how low any order could bring Pullwise / stock
//
// FILEs are go test's output as it printed it, kubelet's and CRI's in any
// mix; with none, it reads standard input. So a table in the docs can be
// checked against, or made again from, the runs it was made from.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	sh, files, err := parseArgs(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		os.Exit(2) // the flag set said why
	}
	if err := tables(os.Stdout, sh, files); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

// The tables benchtable makes.
type shape int

const (
	ranges shape = iota // per scenario, the range over the runs
	perRun              // a row per run
	floors              // per CRI scenario, the bound over stock's time
)

// parseArgs reads benchtable's arguments, from the command line or from
// a docs page's <!-- benchtable: ... --> comment (TestDocsTables).
func parseArgs(args []string) (shape, []string, error) {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	runs := fs.Bool("runs", false, "a row per run instead of the ranges over runs")
	fl := fs.Bool("floors", false, "per CRI scenario, the lowest Pullwise / stock any order could reach, beside Pullwise's")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: benchtable [-runs | -floors] [FILE...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return ranges, nil, err
	}
	switch {
	case *runs && *fl:
		err := errors.New("-runs and -floors make different tables: give one")
		fmt.Fprintln(fs.Output(), err)
		return ranges, nil, err
	case *runs:
		return perRun, fs.Args(), nil
	case *fl:
		return floors, fs.Args(), nil
	}
	return ranges, fs.Args(), nil
}

// tables reads every file (standard input when there is none) and
// writes the table asked for.
func tables(w io.Writer, sh shape, files []string) error {
	var runs []run
	read := func(r io.Reader, name string) error {
		rs, err := readRuns(r, name)
		runs = append(runs, rs...)
		return err
	}
	if len(files) == 0 {
		if err := read(os.Stdin, "stdin"); err != nil {
			return err
		}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = read(f, name)
		f.Close()
		if err != nil {
			return err
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("no corpus runs with ratios in %v", files)
	}
	switch sh {
	case perRun:
		writeRuns(w, runs)
	case floors:
		return writeFloors(w, runs)
	default:
		writeRanges(w, runs)
	}
	return nil
}
