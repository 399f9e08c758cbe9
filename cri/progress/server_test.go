package progress

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"

	"github.com/pullwise/pullwise/transfer/hub"
)

func newServer(t *testing.T, ttl time.Duration) (*Server, *hub.Hub) {
	t.Helper()
	return newServerWith(t, Options{TokenTTL: ttl})
}

func newServerWith(t *testing.T, o Options) (*Server, *hub.Hub) {
	t.Helper()
	h := &hub.Hub{}
	o.Address, o.Interval = "127.0.0.1", time.Millisecond
	s, err := Listen(h, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, h
}

func forImage(img string) hub.Selector { return func(p hub.Pull) bool { return p.Image == img } }

func get(t *testing.T, url string) *http.Response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestTokenIsSingleUseAndExpires(t *testing.T) {
	s, h := newServer(t, 50*time.Millisecond)
	h.Join("k", "img", "")
	url, err := s.Issue(forImage("img"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") || len(url[strings.LastIndex(url, "/")+1:]) != 32 {
		t.Fatalf("url %q: want loopback and a 128-bit token", url)
	}
	if r := get(t, url+"?follow=false"); r.StatusCode != 200 {
		t.Fatalf("first use: %s", r.Status)
	}
	if r := get(t, url+"?follow=false"); r.StatusCode != 404 {
		t.Fatalf("second use: %s, want 404", r.Status)
	}
	expired, _ := s.Issue(forImage("img"))
	// The token's lifetime is what is tested, so real time must pass: the
	// server reads time.Now and takes no clock, and no condition can be
	// polled for, since a request to the token would use it up. Just over
	// its 50ms lifetime.
	time.Sleep(60 * time.Millisecond)
	if r := get(t, expired); r.StatusCode != 404 {
		t.Fatalf("expired token: %s, want 404", r.Status)
	}
	if r := get(t, s.Addr()+"/progress/00000000000000000000000000000000"); r.StatusCode != 404 {
		t.Fatalf("made-up token: %s", r.Status)
	}
}

func TestStreamFollowsUntilPullEnds(t *testing.T) {
	s, h := newServer(t, time.Minute)
	h.Join("k", "img", "")
	url, _ := s.Issue(forImage("img"))
	resp := get(t, url)
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	lines := make(chan map[string]any)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("line %q: %v", sc.Text(), err)
				return
			}
			lines <- m
		}
	}()
	first := <-lines // the current state: the image line
	if first["image"] != "img" || first["progress"] != 0.0 || first["total"] != 0.0 {
		t.Fatalf("first line %v", first)
	}
	h.Update("k", transfer.Progress{Event: "downloading", Name: "layer-sha256:a", Progress: 5, Total: 10})
	h.Finish("k", nil)
	var got []map[string]any
	for m := range lines {
		got = append(got, m)
	}
	last := got[len(got)-1]
	if _, hasLayer := last["layer"]; hasLayer || last["progress"] != 10.0 || last["total"] != 10.0 {
		t.Fatalf("stream ended on %v, want the complete image line", last)
	}
	for _, m := range got {
		for k := range m {
			if k != "image" && k != "layer" && k != "progress" && k != "total" && k != "error" {
				t.Fatalf("unexpected key %q in %v", k, m)
			}
		}
	}
}
