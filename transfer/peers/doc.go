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
//	done := n.Expect(blobs...)       // a pull's blobs, from its image manifest
//	defer done()                     // when that pull ends
//	w := n.Arriving(dgst, offset, size) // a registry body's bytes, for followers
//
//	peers.NewTransport(n)            // or: a peer as one more registry host
//	peers.Owner(dgst, n.Peers())     // the one live peer to fetch dgst first
//
// # One registry copy for a simultaneous rollout
//
// Each digest has one owner: Owner over the live peers and the node
// itself, the same on every node that sees the same peers. Fetch asks
// the owner first, directly, without a DHT lookup. A pull tells its node
// the blobs it will fetch (Expect, from the image manifest, before any
// layer) and tees the bytes it reads from a registry into Arriving,
// which appends them to a file in SpoolDir. The owner answers from its
// store; else from the blob's arrival, streamed as it grows (the
// follower waits on each read for at most ReadTimeout without progress);
// else, when a pull of it expects the blob, it waits for the download to
// start (until that pull is done, or startWait, 2 minutes), sending a
// wait line every second meanwhile. Else the owner coordinates (claims.go): the first peer to
// ask is told to fetch the blob from its registry itself (and refused),
// and every later one is sent to follow that peer, which expects the
// blob; the owner's own pull follows it too. So an owner that does not
// pull the image, or has not read its manifest yet, still gets the blob
// fetched once. The owner costs a miss one round trip before the DHT's
// providers are asked (FindTimeout),
// and an owner that dies or stalls costs at most ReadTimeout beyond the
// bytes it sent. A follower spools and verifies the whole blob like any
// peer's, and fails over to the DHT's providers, then ErrNotFound: its
// caller goes to the registry. A node that asks another as owner of a
// digest, or got it from a peer, refuses at once to make others wait for
// its own download of it, so two nodes whose peers differ never wait for
// each other. An arrival's file goes when the last pull expecting it is
// done: at once when incomplete or when the store holds the blob, else
// lingerAfterDone (15 s) later, and never while a follower reads it;
// Close removes them all. A resume (a body from the offset the kept bytes
// end at) goes on with the arrival; any other offset abandons it, and
// followers go elsewhere.
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
//	{"digest":"sha256:…","offset":0,"follow":true}\n   to the owner
//
// and the server answers one JSON line, at most 1 KiB like the request:
//
//	{"size":1234}\n      then size-offset raw bytes, then it closes
//	{"size":0,"error":"not found"}\n   and it closes: no body
//
// preceded, for a follow request only, by any number of
//
//	{"size":0,"wait":true}\n   still waiting for the download to start
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
// pullwise_peer_bytes_fetched_total,
// pullwise_peer_fetch_failures_total{reason} (Reason* constants; the
// owner refusing is not a failure), pullwise_peer_requests_refused_total
// and pullwise_peer_blobs_served_arriving_total.
package peers
