package peers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ipnet "github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/net/pnet"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	mss "github.com/multiformats/go-multistream"
)

// bootTarget is how many peers a node connects to through its bootstrap
// entries; the DHT finds the rest. A few, not all: a DNS name of a
// 500-node cluster names 500 nodes.
const bootTarget = 8

// bootstrapper turns Config.Bootstrap into peers to connect to.
type bootstrapper struct {
	static []peer.AddrInfo
	names  []string // "name:port" of the dns: entries
	psk    ipnet.PSK
	key    crypto.PrivKey

	mu    sync.Mutex
	found map[string]peer.AddrInfo // by "ip:port": IDs learned by probe
}

func newBootstrapper(entries []string, psk ipnet.PSK, key crypto.PrivKey) (*bootstrapper, error) {
	b := &bootstrapper{psk: psk, key: key, found: map[string]peer.AddrInfo{}}
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e, "dns:"); ok {
			name, port, err := net.SplitHostPort(rest)
			if _, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || name == "" {
				return nil, fmt.Errorf("peers: bootstrap entry %q: want dns:name:port", e)
			}
			b.names = append(b.names, rest)
			continue
		}
		ai, err := peer.AddrInfoFromString(e)
		if err != nil {
			return nil, fmt.Errorf("peers: bootstrap entry %q: want a multiaddr ending in /p2p/<id>, or dns:name:port: %w", e, err)
		}
		b.static = append(b.static, *ai)
	}
	return b, nil
}

// known is every bootstrap peer known by ID; the DHT falls back to them
// when its routing table empties.
func (b *bootstrapper) known() []peer.AddrInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := append([]peer.AddrInfo(nil), b.static...)
	for _, ai := range b.found {
		out = append(out, ai)
	}
	return out
}

// join connects n to bootstrap peers, in random order so that a cluster
// does not crowd its first entry, until n has bootTarget peers.
func (b *bootstrapper) join(ctx context.Context, n *Node) {
	b.resolve(ctx, n.cfg.ReadTimeout, n.ID())
	cands := b.known()
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	for _, ai := range cands {
		if len(n.host.Network().Peers()) >= bootTarget {
			return
		}
		if ai.ID == n.ID() || n.host.Network().Connectedness(ai.ID) == network.Connected {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, n.cfg.ReadTimeout)
		if err := n.host.Connect(cctx, ai); err != nil {
			log.G(ctx).WithError(err).Debugf("peers: bootstrap peer %s", ai.ID)
		}
		cancel()
	}
}

// resolve looks the dns: entries up and learns the peer ID behind every
// new address. An address that no longer resolves is forgotten.
func (b *bootstrapper) resolve(ctx context.Context, timeout time.Duration, self peer.ID) {
	if len(b.names) == 0 {
		return
	}
	seen := map[string]bool{}
	for _, hp := range b.names {
		name, port, _ := net.SplitHostPort(hp)
		lctx, cancel := context.WithTimeout(ctx, timeout)
		ips, err := net.DefaultResolver.LookupHost(lctx, name)
		cancel()
		if err != nil {
			log.G(ctx).WithError(err).Warnf("peers: bootstrap name %s", name)
		}
		for _, ip := range ips {
			addr := net.JoinHostPort(ip, port)
			seen[addr] = true
			b.mu.Lock()
			_, ok := b.found[addr]
			b.mu.Unlock()
			if ok {
				continue
			}
			ai, err := b.probe(ctx, addr, timeout)
			if err != nil {
				log.G(ctx).WithError(err).Debugf("peers: bootstrap address %s", addr)
				continue
			}
			if ai.ID != self {
				b.mu.Lock()
				b.found[addr] = ai
				b.mu.Unlock()
			}
		}
	}
	b.mu.Lock()
	for addr := range b.found {
		if !seen[addr] {
			delete(b.found, addr)
		}
	}
	b.mu.Unlock()
}

// probe learns the peer ID of the node at addr (ip:port). libp2p dials a
// peer only by ID, and a DNS name gives addresses alone, so this runs the
// first steps of a libp2p dial by hand: the cluster key's protection, then
// a TLS handshake that accepts any ID and reports the one it saw. Only a
// node holding the cluster key gets that far.
func (b *bootstrapper) probe(ctx context.Context, addr string, timeout time.Duration) (peer.AddrInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	raddr, err := manet.FromNetAddr(c.RemoteAddr())
	if err != nil {
		return peer.AddrInfo{}, err
	}
	pc, err := pnet.NewProtectedConn(b.psk, c)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	if err := mss.SelectProtoOrFail(libp2ptls.ID, pc); err != nil {
		return peer.AddrInfo{}, err
	}
	tpt, err := libp2ptls.New(libp2ptls.ID, b.key, nil)
	if err != nil {
		return peer.AddrInfo{}, err
	}
	sc, err := tpt.SecureOutbound(ctx, pc, "")
	if err != nil {
		return peer.AddrInfo{}, err
	}
	defer sc.Close()
	return peer.AddrInfo{ID: sc.RemotePeer(), Addrs: []multiaddr.Multiaddr{raddr}}, nil
}

// bootstrapLoop joins at start, in the background so that peers that are
// down do not hold New up, then again every BootstrapInterval, so that a
// node that started first, or lost its peers, finds the cluster.
func (n *Node) bootstrapLoop() {
	t := time.NewTicker(n.cfg.BootstrapInterval)
	defer t.Stop()
	n.boot.join(n.ctx, n)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.boot.join(n.ctx, n)
		}
	}
}
