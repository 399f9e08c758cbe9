package registry

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TokenServer is a bearer token service on loopback, as auth.docker.io is
// to Docker Hub: a registry with Fault.RequireBearer answers a request
// without a valid token 401 with a challenge naming this server, and the
// client fetches a token here. Tokens are random and opaque; the server
// counts every fetch, so a test asserts on what clients asked of it.
type TokenServer struct {
	host string
	// Credentials, when set, are required to fetch a token.
	creds *BasicAuth

	mu      sync.Mutex
	tokens  map[string]string // token: the scope it grants
	fetches map[string]int    // scope: token fetches, failed ones too
	failing int               // fetches still to answer 503
}

// StartTokenServer runs a token server until the test ends. creds, when
// not nil, are the basic credentials a fetch must present.
func StartTokenServer(t testing.TB, creds *BasicAuth) *TokenServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &TokenServer{host: ln.Addr().String(), creds: creds, tokens: map[string]string{}, fetches: map[string]int{}}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close below
	t.Cleanup(func() { srv.Close() })
	return s
}

// Fetches returns how many tokens were fetched for scope, such as
// "repository:app:pull".
func (s *TokenServer) Fetches(scope string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches[scope]
}

// FailNext answers the next n token fetches 503, as a token service
// having a bad moment.
func (s *TokenServer) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = n
}

// String lists the fetches by scope, for failure messages.
func (s *TokenServer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.fetches)
}

func (s *TokenServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if s.creds != nil {
		if u, p, ok := req.BasicAuth(); !ok || u != s.creds.User || p != s.creds.Password {
			http.Error(w, "bad credentials", http.StatusUnauthorized)
			return
		}
	}
	scope := req.URL.Query().Get("scope")
	s.mu.Lock()
	s.fetches[scope]++
	fail := s.failing > 0
	if fail {
		s.failing--
	}
	s.mu.Unlock()
	if fail {
		http.Error(w, "token service unavailable", http.StatusServiceUnavailable)
		return
	}
	b := make([]byte, 16)
	rand.Read(b) //nolint:errcheck // never fails (crypto/rand)
	token := hex.EncodeToString(b)
	s.mu.Lock()
	s.tokens[token] = scope
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"token": token, "expires_in": 300}) //nolint:errcheck
}

// challenge is the WWW-Authenticate a registry sends for repo.
func (s *TokenServer) challenge(repo string) string {
	return fmt.Sprintf(`Bearer realm="http://%s/token",service="pullwise-test",scope="repository:%s:pull"`, s.host, repo)
}

// valid reports whether req carries a token this server gave for repo.
func (s *TokenServer) valid(req *http.Request, repo string) bool {
	token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[token] == "repository:"+repo+":pull"
}
