package peers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/records"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"
)

// DHTPrefix is the prefix of the node's DHT protocols: a node never
// speaks to, nor is found by, a public (/ipfs) DHT.
const DHTPrefix = "/pullwise"

// Node is one member of the cluster: it serves the blobs of its content
// store to its peers and fetches blobs from them.
type Node struct {
	cfg   Config
	store content.Provider
	host  host.Host
	dht   *dht.IpfsDHT
	up    *throttle
	boot  *bootstrapper
	stats counters
	// claims coordinate the digests this node owns (claims.go).
	claims claims
	sh     *shares // expected and arriving blobs, for peers to follow
	// lookups counts the fetches that asked the DHT for providers.
	lookups atomic.Int64

	// ctx ends on Close; every goroutine and stream handler of the node
	// watches it, and wg counts them, so Close returns only once they
	// have all ended.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	held   map[digest.Digest]struct{} // advertised, announced again while held
	fresh  []digest.Digest            // offered, not yet announced
	wake   chan struct{}              // the announce loop has fresh work
}

// New starts a node: a libp2p host on cfg.ListenAddr that only peers
// holding the cluster key can connect to, a DHT server under DHTPrefix,
// the blob protocol serving store, and the background work that joins
// the bootstrap peers and keeps what the node holds announced. store is
// read without a namespace: pass containerd's local content store, not
// the namespaced metadata store. ctx is for the start only (and its
// logger): the node runs until Close.
func New(ctx context.Context, cfg Config, store content.Provider) (*Node, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	psk, err := loadClusterKey(cfg.ClusterKeyFile)
	if err != nil {
		return nil, err
	}
	key, err := loadIdentity(cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	boot, err := newBootstrapper(cfg.Bootstrap, psk, key)
	if err != nil {
		return nil, err
	}
	// Options are explicit so that nothing dials out by itself: no
	// relay, no hole punching, no UPnP port mapping (off unless asked),
	// no reachability probing, no mDNS (never wired in), no metrics on
	// the global registry.
	h, err := libp2p.New(
		libp2p.Identity(key),
		libp2p.PrivateNetwork(psk),
		libp2p.ListenAddrStrings(cfg.ListenAddr),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.DisableRelay(),
		libp2p.ForceReachabilityPublic(),
		libp2p.DisableMetrics(),
	)
	if err != nil {
		return nil, fmt.Errorf("peers: start libp2p host: %w", err)
	}
	d, err := dht.New(h,
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(DHTPrefix),
		dht.DisableValues(),
		dht.ProviderManagerOpts(
			records.ProvideValidity(cfg.RecordTTL),
			records.ProviderAddrTTL(cfg.RecordTTL),
			records.CleanupInterval(cfg.RecordTTL/2),
		),
		dht.BootstrapPeersFunc(boot.known),
	)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("peers: start DHT: %w", err)
	}
	n := &Node{
		cfg:   cfg,
		store: store,
		host:  h,
		dht:   d,
		up:    newThrottle(cfg.UploadBytesPerSec),
		boot:  boot,
		sh:    newShares(cfg.SpoolDir),
		held:  map[digest.Digest]struct{}{},
		wake:  make(chan struct{}, 1),
	}
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	h.SetStreamHandler(BlobProtocol, n.serve)
	n.goLoop(n.bootstrapLoop)
	n.goLoop(n.reprovideLoop)
	return n, nil
}

// goLoop runs f in a goroutine that Close waits for.
func (n *Node) goLoop(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// enter counts a stream handler in, unless the node is closing; the
// handler calls n.wg.Done when it returns.
func (n *Node) enter() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Add(1)
	return true
}

// Close stops the node: it stops serving, leaves the DHT, closes every
// connection, waits for all the node's goroutines to end and removes
// every arrival's file; Expect and Arriving do nothing from then on.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.host.RemoveStreamHandler(BlobProtocol)
	err := errors.Join(n.dht.Close(), n.host.Close())
	n.wg.Wait()
	n.sh.close()
	return err
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Addrs are the node's addresses with its peer ID (/ip4/…/tcp/…/p2p/…),
// as another node's Bootstrap takes them.
func (n *Node) Addrs() []string {
	addrs, _ := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()})
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

// Peers returns the live peers, sorted: those connected now that are in
// the node's DHT routing table, so they hold the cluster key and speak
// this protocol. Owner chooses among them.
func (n *Node) Peers() []peer.ID {
	var ids []peer.ID
	for _, p := range n.dht.RoutingTable().ListPeers() {
		if n.host.Network().Connectedness(p) == network.Connected {
			ids = append(ids, p)
		}
	}
	slices.Sort(ids)
	return ids
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats { return n.stats.snapshot() }

// Collector exports the counters as pullwise_peer_bytes_served_total,
// pullwise_peer_bytes_fetched_total,
// pullwise_peer_fetch_failures_total{reason},
// pullwise_peer_blobs_served_arriving_total,
// pullwise_peer_requests_refused_total, pullwise_peer_announcements_total
// and the gauge pullwise_peers_connected; the caller registers it.
func (n *Node) Collector() prometheus.Collector {
	return collector{c: &n.stats, peers: func() int { return len(n.Peers()) }}
}
