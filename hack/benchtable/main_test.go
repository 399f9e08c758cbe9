package main

import "testing"

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		shape shape
		bad   bool
	}{
		{args: []string{"a.txt"}, shape: ranges},
		{args: []string{"-runs", "a.txt"}, shape: perRun},
		{args: []string{"-floors", "a.txt"}, shape: floors},
		{args: []string{"-runs", "-floors", "a.txt"}, bad: true},
	} {
		sh, files, err := parseArgs(tc.args)
		if tc.bad {
			if err == nil {
				t.Errorf("parseArgs(%q) took both shapes", tc.args)
			}
			continue
		}
		if err != nil || sh != tc.shape || len(files) != 1 || files[0] != "a.txt" {
			t.Errorf("parseArgs(%q) = %v, %q, %v; want shape %v and a.txt", tc.args, sh, files, err, tc.shape)
		}
	}
}
