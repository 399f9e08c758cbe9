package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestBarViewShowsLayersAndImage(t *testing.T) {
	var out bytes.Buffer
	v := newBarView(&out)
	v.update(line{Image: "example.com/app:v1", Layer: "sha256:0123456789abcdef", Progress: 50, Total: 100})
	v.update(line{Image: "example.com/app:v1", Progress: 50, Total: 200})
	v.draw(true)
	s := out.String()
	for _, want := range []string{"sha256:01234", "example.com/app:v1", "ETA", "50.0 B/100.0 B"} {
		if !strings.Contains(s, want) {
			t.Errorf("bars lack %q:\n%s", want, s)
		}
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
