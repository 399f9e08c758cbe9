// Package peers lets Pullwise nodes fetch image blobs from each other
// over libp2p, so that a rollout to N nodes costs the registry about one
// copy of each layer (issue 40). It is self-contained: it knows a content
// store and digests, not pulls; the pull path wires it in.
//
// # Use
//
//	n, err := peers.New(ctx, cfg, localStore) // cfg from DefaultConfig
//	defer n.Close()
//	reg.MustRegister(n.Collector())
//
//	n.Advertise(ctx, layer.Digest)  // once the layer is in the store
//	n.Forget(layer.Digest)          // when it should no longer be served
//
//	rc, peerID, err := n.Fetch(ctx, desc.Digest, desc.Size, offset)
//	// errors.Is(err, peers.ErrNotFound): go to the registry
//
//	peers.NewTransport(n)            // or: a peer as one more registry host
//	peers.Owner(dgst, n.Peers())     // the one live peer to fetch dgst first
//
// # What a node runs
//
// A libp2p host listening on Config.ListenAddr (TCP only), inside a
// private network: every connection is protected by the cluster key
// (Config.ClusterKeyFile, required), so a host without it can neither
// connect, read blobs nor write provider records. Nothing dials out by
// itself: no public bootstrap peers, relay, hole punching, port mapping,
// reachability probing or mDNS. Peers are found through Config.Bootstrap
// and a Kademlia DHT in server mode under the protocol prefix /pullwise,
// which never meets a public DHT. Provider records live Config.RecordTTL;
// a node announces again, every RecordTTL/2, what it advertised and its
// store still holds, so a blob that garbage collection removed drops out
// of the DHT within RecordTTL, and the server refuses it at once anyway.
//
// # Trust
//
// Peers hold the cluster key, yet their bytes are never trusted: Fetch
// spools the whole blob to Config.SpoolDir, hashes it as it arrives and
// returns it only when digest and size match. A peer that sends a wrong
// byte, stalls for Config.ReadTimeout, refuses or breaks off is skipped
// for the next provider; when none is left, or Config.FindTimeout of
// waiting for providers has passed, the error wraps ErrNotFound. Only
// blobs are served, by digest: manifests and tags always come from a
// registry, so a node gets from its peers only blobs whose digests its own
// credentials let it resolve.
//
// # Wire format (BlobProtocol, /pullwise/blob/1)
//
// One stream per blob. The client sends one JSON line,
//
//	{"digest":"sha256:…","offset":0}\n
//
// and the server answers one JSON line, at most 1 KiB like the request:
//
//	{"size":1234}\n      then size-offset raw bytes, then it closes
//	{"size":0,"error":"not found"}\n   and it closes: no body
//
// Unknown fields are ignored, so later versions may add some. The server
// sends at most Config.UploadBytesPerSec over all its streams together
// and drops a client that reads nothing for ReadTimeout. Fetch asks for
// offset 0 (it verifies whole blobs); the server honours any offset, for
// a client that resumes.
//
// # Counters
//
// Stats and Collector: pullwise_peer_bytes_served_total,
// pullwise_peer_bytes_fetched_total and
// pullwise_peer_fetch_failures_total{reason} (Reason* constants).
package peers
