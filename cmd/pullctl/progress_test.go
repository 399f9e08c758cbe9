package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vbauerster/mpb/v8"
)

// lastFrame is what a terminal shows at the end: mpb redraws each frame
// after moving the cursor up and clearing.
func lastFrame(out string) []string {
	if i := strings.LastIndex(out, "\x1b[J"); i >= 0 {
		out = out[i+len("\x1b[J"):]
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

func TestBarView(t *testing.T) {
	const app, db = "example.com/app:v1", "example.com/db:v2"
	layer := func(img, d string, progress, total int64) line {
		return line{Image: img, Layer: "sha256:" + d + "0123456789abcdef", Progress: progress, Total: total}
	}
	for _, tc := range []struct {
		name  string
		lines []line
		// sums is each image line's bytes done after the lines.
		sums map[string]int64
		want []string // the last frame, line by line, as substrings
	}{
		{
			name: "an image line sums its layers",
			lines: []line{
				layer(app, "aa", 512<<10, 1<<20), layer(app, "bb", 1<<20, 2<<20),
			},
			sums: map[string]int64{app: 1536 << 10},
			// Cut short: the stream ended before the pull did.
			want: []string{app + " ", "1.5 MiB / 3.0 MiB", "stopped"},
		},
		{
			name: "a pod's images and their total",
			lines: []line{
				layer(app, "aa", 1<<20, 1<<20), layer(db, "cc", 1<<20, 4<<20), layer(app, "bb", 2<<20, 2<<20),
				{Image: app, Progress: 3 << 20, Total: 3 << 20},
				layer(db, "cc", 4<<20, 4<<20),
				{Image: db, Progress: 4 << 20, Total: 4 << 20},
			},
			sums: map[string]int64{app: 3 << 20, db: 4 << 20},
			want: []string{app + " ", "3.0 MiB / 3.0 MiB", "done", db + " ", "4.0 MiB / 4.0 MiB", "done", "total ", "7.0 MiB / 7.0 MiB", "done"},
		},
		{
			name: "a failed pull",
			lines: []line{
				layer(app, "aa", 1<<20, 2<<20),
				{Image: app, Total: 2 << 20, Error: "context canceled"},
			},
			sums: map[string]int64{app: 1 << 20},
			want: []string{app + " ", "1.0 MiB / 2.0 MiB", "stopped"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			v := newBarView(&out, mpb.WithWidth(120), mpb.WithAutoRefresh())
			for _, l := range tc.lines {
				v.update(l)
			}
			for img, want := range tc.sums {
				if got := v.images[img].bar.Current(); got != want {
					t.Errorf("%s line at %d bytes, want %d", img, got, want)
				}
			}
			v.finish()
			frame := lastFrame(out.String())
			// Layers are gone once their image is done or stopped: an image
			// with many layers still fits the screen.
			if len(frame) != len(tc.want)/3 {
				t.Fatalf("last frame has %d lines, want %d:\n%s", len(frame), len(tc.want)/3, strings.Join(frame, "\n"))
			}
			for i, row := range frame {
				for _, want := range tc.want[3*i : 3*i+3] {
					if !strings.Contains(row, want) {
						t.Errorf("line %d %q lacks %q", i, row, want)
					}
				}
			}
		})
	}
}

func TestClip(t *testing.T) {
	if got := clip("registry.example.com:5000/team/very/long/path/app:v1", 20); got != "…ry/long/path/app:v1" {
		t.Fatalf("clip = %q", got)
	}
	if got := clip("short:v1", 20); got != "short:v1" {
		t.Fatalf("clip = %q", got)
	}
}

func TestWatchFailsOnPullError(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		status  int
		wantErr string
	}{
		{name: "complete", status: 200, body: `{"image":"a","progress":1,"total":1}` + "\n"},
		{name: "failed", status: 200, body: `{"image":"a","progress":0,"total":1,"error":"context canceled"}` + "\n", wantErr: "context canceled"},
		{name: "used token", status: 404, wantErr: "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			var out bytes.Buffer
			err := watch(t.Context(), srv.URL, &out, false)
			if tc.wantErr == "" {
				if err != nil || out.String() != tc.body {
					t.Fatalf("err %v, output %q", err, out.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}
