package progress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
)

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestBadRequestsGet404Or400(t *testing.T) {
	s, h := newServer(t, time.Minute)
	h.Join("k", "img", "")
	for _, tc := range []struct {
		name string
		path string
		want int
	}{
		{"made-up token", "/progress/" + strings.Repeat("ab", 16), 404},
		{"short token", "/progress/abc", 404},
		{"oversized token", "/progress/" + strings.Repeat("a", 4<<10), 404},
		{"extra segment", "/progress/" + strings.Repeat("ab", 16) + "/x", 404},
		{"other path", "/debug/pprof/", 404},
		{"bad follow", "/progress/" + strings.Repeat("ab", 16) + "?follow=maybe", 400},
		{"oversized query", "/progress/" + strings.Repeat("ab", 16) + "?follow=false&x=" + strings.Repeat("a", 4<<10), 400},
		{"bad query escape", "/progress/" + strings.Repeat("ab", 16) + "?follow=%zz", 400},
		// Beyond maxHeaderBytes net/http itself refuses the request.
		{"header beyond the limit", "/progress/" + strings.Repeat("a", 64<<10), 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status(t, s.Addr()+tc.path); got != tc.want {
				t.Fatalf("GET %.60s…: %d, want %d", tc.path, got, tc.want)
			}
		})
	}
}

func TestBadQueryDoesNotUseTheToken(t *testing.T) {
	s, h := newServer(t, time.Minute)
	h.Join("k", "img", "")
	url, _ := s.Issue(forImage("img"))
	if got := status(t, url+"?follow=maybe"); got != 400 {
		t.Fatalf("bad follow: %d, want 400", got)
	}
	if got := status(t, url+"?follow=0"); got != 200 {
		t.Fatalf("the token after a refused request: %d, want 200", got)
	}
}

// loris opens a connection and sends part of a request line, never the end.
func loris(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("GET /progress/")); err != nil {
		t.Fatal(err)
	}
	return c
}

// getWithin is a follow=false GET of url that gives up after d.
func getWithin(url string, d time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"?follow=false", nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func TestConnectionCapHolds(t *testing.T) {
	s, h := newServerWith(t, Options{TokenTTL: time.Minute, MaxConnections: 2, ClientTimeout: time.Hour})
	h.Join("k", "img", "")
	first := loris(t, s.Addr())
	loris(t, s.Addr())
	url, _ := s.Issue(forImage("img"))
	// Both connections are taken: a third is not served. The wait is what
	// is tested; a broken cap answers at once.
	if code, err := getWithin(url, 300*time.Millisecond); err == nil {
		t.Fatalf("a third connection was served (%d) with the cap at 2", code)
	}
	first.Close()
	url, _ = s.Issue(forImage("img"))
	if code, err := getWithin(url, 10*time.Second); err != nil || code != 200 {
		t.Fatalf("after a connection closed: %d, %v; want 200", code, err)
	}
}

func TestSlowLorisIsCutByTheHeaderTimeout(t *testing.T) {
	s, h := newServerWith(t, Options{TokenTTL: time.Minute, MaxConnections: 2, ClientTimeout: 200 * time.Millisecond})
	h.Join("k", "img", "")
	conns := []net.Conn{loris(t, s.Addr()), loris(t, s.Addr())}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 512))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("slow client %d still connected after 10s", i)
		}
		_ = n // net/http may answer 408 before closing; either way it is cut
	}
	url, _ := s.Issue(forImage("img"))
	if code, err := getWithin(url, 10*time.Second); err != nil || code != 200 {
		t.Fatalf("after the slow clients were cut: %d, %v; want 200", code, err)
	}
}

// TestStalledReaderLosesItsStream: a subscriber that never reads while a
// pull sends a lot is cut once a write has waited ClientTimeout, and its
// connection goes to the next client. Publishing never waits on it.
func TestStalledReaderLosesItsStream(t *testing.T) {
	s, h := newServerWith(t, Options{TokenTTL: time.Minute, MaxConnections: 1, ClientTimeout: 200 * time.Millisecond})
	h.Join("k", "img", "")
	stop := make(chan struct{})
	pumped := make(chan int, 1)
	go func() {
		// Thousands of layers moving: the stream has far more to send
		// than socket buffers hold.
		n := 0
		defer func() { pumped <- n }()
		for ; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			for l := range 2000 {
				h.Update("k", transfer.Progress{Event: "downloading", Name: fmt.Sprintf("layer-sha256:%064d", l), Progress: int64(n), Total: 1 << 40})
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-pumped })

	url, _ := s.Issue(forImage("img"))
	// A small receive buffer, set before connecting, so the client's
	// window stays small and the server's writes block soon.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	stalled, err := d.Dial("tcp", strings.TrimPrefix(s.Addr(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := fmt.Fprintf(stalled, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", strings.TrimPrefix(url, s.Addr())); err != nil {
		t.Fatal(err)
	}
	// The only connection is the stalled one; once its stream is cut the
	// next client is served.
	next, _ := s.Issue(forImage("img"))
	if code, err := getWithin(next, 30*time.Second); err != nil || code != 200 {
		t.Fatalf("next client behind a stalled reader: %d, %v; want 200", code, err)
	}
}
