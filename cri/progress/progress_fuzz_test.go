package progress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"

	"github.com/pullwise/pullwise/transfer/hub"
)

// rawGet sends target as the request target of a GET, byte for byte, the
// way an attacker's client would, and returns the response status and
// body. after, if set, runs once the headers are in; without it the body
// is not read (a followed stream may stay open).
func rawGet(t *testing.T, addr, target string, after func()) (int, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	// Closing the connection ends the body; Body.Close would drain it.
	if after == nil {
		return resp.StatusCode, nil
	}
	after()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %q: body: %v", target, err)
	}
	return resp.StatusCode, body
}

// fuzzServer is a progress server for one fuzz target, shared by its inputs.
func fuzzServer(f *testing.F) (*Server, *hub.Hub) {
	h := &hub.Hub{}
	s, err := Listen(h, Options{Address: "127.0.0.1", TokenTTL: time.Minute, Interval: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	return s, h
}

// FuzzProgressURL sends request targets around a freshly issued token.
// Only the issued token, once, opens a stream; any other path, query or
// spelling gets no stream and no panic.
func FuzzProgressURL(f *testing.F) {
	s, _ := fuzzServer(f)
	for _, seed := range []struct {
		prefix, suffix string
		token          bool
	}{
		{"/progress/", "?follow=false", true}, {"/progress/", "", false}, {"/progress/", "x?follow=false", true},
		{"/progress/../progress/", "?follow=false", true}, {"/progress//", "", true}, {"/PROGRESS/", "", true},
		{"/progress/%00", "", false}, {"*", "", false}, {"http://x/progress/", "?follow=false", true},
		{"/progress/", "/extra", true}, {"/progress/", "?follow=false&follow=true", true},
		{"/progress/00000000000000000000000000000000", "", false},
	} {
		f.Add(seed.prefix, seed.suffix, seed.token)
	}
	f.Fuzz(func(t *testing.T, prefix, suffix string, withToken bool) {
		issued, err := s.Issue(func(hub.Pull) bool { return false })
		if err != nil {
			t.Fatal(err)
		}
		token := issued[strings.LastIndex(issued, "/")+1:]
		target := prefix + suffix
		if withToken {
			target = prefix + token + suffix
		}
		// Targets the HTTP/1.1 request line cannot carry are the client's
		// problem, not the server's.
		if target == "" || strings.ContainsAny(target, " \r\n") {
			return
		}
		code, _ := rawGet(t, s.Addr(), target+sep(target)+"follow=false", nil)
		if code == http.StatusOK {
			// The target as the server reads it: origin or absolute form.
			u, err := url.ParseRequestURI(target)
			if err != nil || u.Path != "/progress/"+token {
				t.Fatalf("GET %q opened a stream; the issued path is /progress/%s", target, token)
			}
			if again, _ := rawGet(t, s.Addr(), target, nil); again != http.StatusNotFound {
				t.Fatalf("GET %q a second time: %d, want 404", target, again)
			}
		}
	})
}

func sep(target string) string {
	if strings.Contains(target, "?") {
		return "&"
	}
	return "?"
}

// utf8Model is what JSON can carry of s: each byte that is not part of
// valid UTF-8 becomes U+FFFD, as encoding/json writes it.
func utf8Model(s string) string { return string([]rune(s)) }

var streamKeys atomic.Int64

// FuzzProgressStream drives a pull with arbitrary names, sizes and error
// text through the hub and reads it back through a real progress URL,
// following it to the pull's end. Every line must be one JSON object with
// keys from the KEP's set, progress and total always present, and the
// values the pull reported (strings as JSON can carry them).
func FuzzProgressStream(f *testing.F) {
	s, h := fuzzServer(f)
	f.Add("docker.io/library/busybox:latest", "sha256:aa", "", int64(5), int64(10), false)
	f.Add("img\n{\"x\":1}", "sha256:\u2028", "boom\x00\xff", int64(-1), int64(1<<62), true)
	f.Add("<script>", "", "", int64(0), int64(0), true)
	f.Add("\xff\xfe", "sha256:bb", "unexpected status 500\r\n", int64(1<<63-1), int64(-5), true)
	f.Fuzz(func(t *testing.T, image, layer, errMsg string, progress, total int64, failed bool) {
		key := fmt.Sprintf("k%d", streamKeys.Add(1))
		h.Join(key, image, "")
		h.Update(key, transfer.Progress{Event: "downloading", Name: "layer-" + layer, Progress: progress, Total: total})
		var pullErr error
		if failed {
			pullErr = errors.New(errMsg)
		}
		url, err := s.Issue(func(p hub.Pull) bool { return p.Image == image })
		if err != nil {
			t.Fatal(err)
		}
		code, body := rawGet(t, s.Addr(), strings.TrimPrefix(url, s.Addr()), func() {
			h.Finish(key, pullErr)
			h.Leave(key, "")
		})
		if code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
		allowed := map[string]bool{"image": true, "layer": true, "progress": true, "total": true, "error": true}
		var last hub.Event
		sawLayer := false
		for _, line := range bytes.Split(bytes.TrimSuffix(body, []byte("\n")), []byte("\n")) {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				t.Fatalf("line %q is not one JSON object: %v", line, err)
			}
			for k := range m {
				if !allowed[k] {
					t.Fatalf("line %q has key %q", line, k)
				}
			}
			var e hub.Event
			if err := json.Unmarshal(line, &e); err != nil || m["progress"] == nil || m["total"] == nil {
				t.Fatalf("line %q: progress and total must be numbers and present: %v", line, err)
			}
			if e.Image != utf8Model(image) {
				t.Fatalf("line %q: image %q, want %q", line, e.Image, utf8Model(image))
			}
			if e.Layer != "" {
				sawLayer = true
				if e.Layer != utf8Model(layer) || e.Progress < 0 || e.Progress > max(e.Total, 0) {
					t.Fatalf("line %q: want layer %q with 0 <= progress <= total", line, utf8Model(layer))
				}
			}
			last = e
		}
		if last.Layer != "" || (!sawLayer && layer != "") {
			t.Fatalf("body %q: want the layer's lines, then the image line last", body)
		}
		if failed && last.Error != utf8Model(errMsg) {
			t.Fatalf("last line error %q, want %q", last.Error, utf8Model(errMsg))
		}
	})
}
